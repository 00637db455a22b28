"""The control plane: wires store, supervisor, the deploy parts, router and API together.

The deploy parts (`wire`, the one place they are put together): `Locks` (per-instance
locks and live operations), the `Runner` every operation goes through, `Passes` (the
reconciler's boot, periodic and mutation passes), `CrashRestarts`, the `ReplicaKeeper`,
and the parts users reach (`Deployer`, `Parking`, `Runs`, `Apps`, `Instances`,
`Domains`, `Seeding`, `Restore`, ...), each given only what it uses.

Start order keeps every failure clear and harmless: the home lock first (one control
plane per home), then the router's port (a busy port fails before the store is even
opened), then the store, boot recovery, and last the API socket and the run socket
(`keelway run`, keelway/api/run_server.py), so a client that can connect sees a
converged system. The router and the apps run in sessions of their own
and survive this process; only `keelway down` (or Ctrl-C in the foreground) stops them
(the apps first, then each replicator with a last sync, so every replica is current with
its stopped database), and `down --keep-apps` leaves them all running. While this
process runs it brings a dead router back at once (keelway.runtime.router_supervisor).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import fcntl
import functools
import io
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from keelway import admin_access, issuance
from keelway.activator.sweep import Sweep
from keelway.api.admin import AdminListener, AdminSettings, admin_settings
from keelway.api.dashboard import Dashboard
from keelway.api.run_server import RunServer
from keelway.api.scrape import Scraper
from keelway.api.server import Api
from keelway.builds import cache as deps_cache
from keelway.builds.manifest import REPLICA
from keelway.builds.stage import stage, sweep
from keelway.clock import Clock, SystemClock, jobs_clock
from keelway.data.objects import LocalObjects, ObjectStore, ObjectStoreError, open_objects
from keelway.data.replicas import ReplicaError, ReplicaOptions, Replicas
from keelway.deploy import targets
from keelway.deploy.apps import FORGET_APP, Apps
from keelway.deploy.certify import CERTIFY, Certifier
from keelway.deploy.crash_restarts import RECOVER, RESTART_CRASHED, CrashRestarts
from keelway.deploy.deployer import ATTEMPTS, START, STOP, Deployer
from keelway.deploy.domains import Domains
from keelway.deploy.drill_schedule import DrillSchedule
from keelway.deploy.errors import OperationError
from keelway.deploy.freezing import FREEZE, Freezing
from keelway.deploy.instances import ADD, DESTROY_ONE, REMOVE, Instances
from keelway.deploy.jobs import JOB, JOBS_AT_ONCE, Jobs
from keelway.deploy.locks import Locks
from keelway.deploy.operation import Recovery, Runner, finalizers, recovery
from keelway.deploy.parking import PARK, WAKE, Parking
from keelway.deploy.passes import Passes
from keelway.deploy.publisher import Publisher
from keelway.deploy.replica_keeper import REPLICATE, ReplicaKeeper
from keelway.deploy.replication import Replication
from keelway.deploy.restore import RESTORE, RESTORE_REPLICA, Restore
from keelway.deploy.rollouts import Rollouts
from keelway.deploy.runs import RUN, Runs
from keelway.deploy.seeding import IMPORT, ROLLBACK, Seeding
from keelway.deploy.snapshots import Snapshots
from keelway.durable import disk_full, disk_full_message, sweep_temp, write_atomic
from keelway.home import PRIVATE_UMASK, Home
from keelway.limits import (
    BUILT_IN,
    BuildLimits,
    LimitError,
    Limits,
    box_build_limits,
    box_limits,
    frozen_budget_bytes,
)
from keelway.reconcile.apply import Reconciler
from keelway.router import client as router_client
from keelway.runtime import router as router_process
from keelway.runtime.limits import protect_keelway
from keelway.runtime.log_times import SAMPLE_EVERY_S, Sampler
from keelway.runtime.logs import rotate_if_large
from keelway.runtime.router import RouterSettings
from keelway.runtime.router_supervisor import RouterSupervisor
from keelway.runtime.supervisor import RefusesToDie, Supervisor, every_process_dies
from keelway.runtime.tree import apps_budget
from keelway.store import SqliteStore, Store

log = logging.getLogger("keelway.daemon")

EXIT_ALREADY_RUNNING = 3
EXIT_PORT_BUSY = 4
EXIT_FAILED = 1
EXIT_DISK_FULL = 5  # `keelway up` knows it: the log that would say so may be full too
DEFAULT_HTTP = "127.0.0.1:8080"
DEMO_APP = "demo"
DEMO_HOST = "demo.localhost"
SWITCH_INTERVAL_S = 0.0005  # the GIL handover (main: why)
_ROTATE_EVERY_S = 10.0


def examples_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples"


class StartupError(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class DeployParts:
    locks: Locks
    runner: Runner
    restarts: CrashRestarts
    keeper: ReplicaKeeper
    passes: Passes
    deployer: Deployer
    parking: Parking
    runs: Runs
    apps: Apps
    instances: Instances
    domains: Domains
    seeding: Seeding
    snapshots: Snapshots
    replication: Replication
    restore: Restore
    # Each kind's boot recovery bound to its part (keelway/deploy/operation.py).
    recovery: Recovery
    jobs: Jobs
    freezing: Freezing

    async def boot(self) -> None:
        """The one boot reconciliation (keelway/deploy/passes.py `Passes.boot`): every
        interrupted operation ended or carried on by its kind."""
        await self.passes.boot(self.recovery)
        # Rollouts are not operations of an instance: each one a crash cut short goes on
        # from its own journal, once every instance's operations are settled.
        self.deployer.resume_interrupted()


def wire(store: Store, home: Home, supervisor: Supervisor, publisher: Publisher, clock: Clock,
         owner: str, objects: ObjectStore | None = None,
         jobs_at_once: int = JOBS_AT_ONCE) -> DeployParts:
    """The deploy parts of one control plane, each given only what it uses, sharing one
    set of locks and live operations and one runner. The one place they are wired."""
    locks = Locks()
    # The object store `up --objects` chose decides where replicas go too
    # (keelway/data/replicas.py replica_url): beside its snapshots in S3, or in the
    # home's own objects directory.
    s3 = objects.url if objects is not None and objects.url.startswith("s3://") else None
    replicas = Replicas(store, home, supervisor, s3)
    objects = objects or LocalObjects(home.objects_dir)
    runner = Runner(store, locks, owner)
    restarts = CrashRestarts(store, home, supervisor, publisher, clock, locks, runner)
    keeper = ReplicaKeeper(store, supervisor, clock, runner, replicas)
    # How the reconciler ends an interrupted operation of each kind with a spec (or
    # leaves it to the kind's own recovery at boot).
    ends = finalizers(PARK, WAKE, FREEZE, STOP, START, RUN, JOB, CERTIFY, RECOVER,
                      RESTART_CRASHED,
                      REPLICATE,
                      *ATTEMPTS.values(), RESTORE, RESTORE_REPLICA, IMPORT, ROLLBACK, ADD,
                      REMOVE, DESTROY_ONE, FORGET_APP)
    reconciler = Reconciler(store, supervisor, home, restarts, keeper,
                            lambda gen: targets.stop_grace_s(store, gen), ends)
    reconciler.orphan_kinds = ends.orphaned
    reconciler.replicate = keeper.replicas is not None
    passes = Passes(store, home, supervisor, publisher, clock, locks, reconciler)
    # The one cycle: an operation converges through the passes, whose restarts are
    # operations of this runner; and the replica keeper follows every operation.
    runner.converger, runner.replica_hook = passes, keeper
    # A rollout judges each cohort on the router's counts for its instances.
    counts = functools.partial(router_client.responses, home.router_socket)
    deployer = Deployer(store, home, supervisor, publisher, locks, runner, restarts,
                        Rollouts(store, clock, counts))
    restore = Restore(store, home, supervisor, publisher, locks, restarts, keeper, runner,
                      objects)
    instances = Instances(store, home, supervisor, publisher, locks, runner, deployer,
                          replicas, objects)
    snapshots = Snapshots(store, home, locks, clock, objects)
    apps = Apps(store, home, locks, runner, instances)
    seeding = Seeding(store, home, supervisor, publisher, locks, restarts, keeper, runner,
                      delete_replica=replicas.delete, objects=objects)
    # Which part carries on each kind a spec recovers at boot.
    recovers = recovery((ADD, instances), (REMOVE, instances), (FORGET_APP, apps),
                        (IMPORT, seeding), (ROLLBACK, seeding), (RESTORE, restore))
    parking = Parking(store, home, supervisor, publisher, clock, runner, restarts)
    return DeployParts(locks, runner, restarts, keeper, passes, deployer, parking,
                       Runs(store, home, supervisor, runner), apps, instances,
                       Domains(store, publisher, locks), seeding, snapshots,
                       Replication(store, keeper, restore, snapshots), restore, recovers,
                       Jobs(store, home, supervisor, runner, parking,
                            jobs_clock(clock, dict(os.environ)), jobs_at_once),
                       Freezing(store, supervisor, publisher, runner))


def objects_url(home: Home, asked: str | None) -> str | None:
    """The object store: the one asked for (and kept in the home for the next `up`),
    else the one a previous `up` asked for, else None (the home's own directory)."""
    if asked is not None:
        open_objects(asked, home)  # a bad URL is refused before it is kept
        write_atomic(home.objects_setting, asked.encode())
        return asked
    if home.objects_setting.exists():
        return home.objects_setting.read_text().strip() or None
    return None


def _take_lock(home: Home) -> int:
    fd = os.open(home.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise StartupError(
            f"keelway is already running for {home.root} (see `keelway status`;"
            " stop it with `keelway down`)", EXIT_ALREADY_RUNNING) from exc
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


async def _boot_router(home: Home, http_addr: str,
                       settings: RouterSettings) -> RouterSupervisor:
    """The router for this home (adopted, restarted or started: RouterSupervisor.boot),
    its failures turned into the exit codes `keelway up` reports."""
    try:
        return await RouterSupervisor.boot(home, http_addr, settings, SystemClock())
    except router_process.RouterPortBusy as exc:
        raise StartupError(
            f"{exc}; is another server using it? Pick another with `keelway up --http ADDR`",
            EXIT_PORT_BUSY) from exc
    except (router_process.RouterStartFailed, router_process.RouterRestartFailed) as exc:
        # A router that could not start on a full disk (its log, its records) says only
        # that it exited; the disk is the cause worth naming, and run() names it.
        if os.statvfs(home.root).f_bavail == 0:
            raise OSError(errno.ENOSPC, f"{exc}; no space is left under {home.root}") from exc
        raise StartupError(str(exc), EXIT_FAILED) from exc
    except (OSError, ValueError) as exc:
        if disk_full(exc):
            raise  # run() says the disk is full, not "cannot listen"
        raise StartupError(f"cannot listen on {http_addr}: {exc}", EXIT_FAILED) from exc


def _router_addr(home: Home, asked: str | None) -> str:
    """Where the router listens: where asked, else where it already listens (or last
    did), so `keelway up` never moves a serving router; else the default."""
    if asked is not None:
        return asked
    recorded = router_process.recorded_settings(home)
    return recorded[0] if recorded is not None else DEFAULT_HTTP


def _authority(home: Home, directory: str | None, email: str | None,
               ca_bundle: str | None,
               challenge: str | None) -> issuance.CertificateAuthority | None:
    """The CA certificates are ordered from: as `up` says (and kept for the next `up`;
    `--acme-directory off`: none), else as a previous `up` said, else Let's Encrypt.
    A flag not given keeps its kept value."""
    kept = issuance.saved_authority(home)
    if directory is None and email is None and ca_bundle is None and challenge is None:
        return kept
    if directory == "off":
        issuance.save_authority(home, None)
        return None
    base = kept or issuance.CertificateAuthority()
    chosen = issuance.CertificateAuthority(
        directory if directory is not None else base.directory,
        email if email is not None else base.email,
        Path(ca_bundle).resolve() if ca_bundle else base.ca_bundle,
        challenge if challenge is not None else base.challenge)
    issuance.save_authority(home, chosen)
    return chosen


def _https_addr(home: Home, asked: str | None) -> str | None:
    """Where the router serves HTTPS: where asked (`off`: nowhere), else where it already
    does (or last did), so `keelway up` never stops or moves a router's HTTPS."""
    if asked == "off":
        return None
    if asked is not None:
        router_process.parse_addr(asked)  # ValueError: not HOST:PORT
        return asked
    recorded = router_process.recorded_settings(home)
    return recorded[1].https if recorded is not None and recorded[1] is not None else None


async def _rotate_logs_forever(home: Home) -> None:
    """Every log's times sampled each second (runtime/log_times.py), and every log
    rotated when large each ROTATE_EVERY_S, in one thread one after the other: a sample
    never races the truncate of its file."""
    sampler = Sampler()
    apps_dir = home.log_dir("-").parent
    rounds = 0

    def tend(rotate: bool) -> None:
        if rotate:
            for path in apps_dir.glob("*/*.log") if apps_dir.exists() else []:
                rotate_if_large(path)
        try:
            sampler.sample(apps_dir)
        except OSError as exc:  # a full disk: times are missed, rotation goes on
            log.warning("sampling the logs' times: %s", exc)

    while True:
        await asyncio.sleep(SAMPLE_EVERY_S)
        rounds += 1
        await asyncio.to_thread(tend, rounds % round(_ROTATE_EVERY_S / SAMPLE_EVERY_S) == 0)


async def run(home: Home, http_addr: str | None, demo: bool, announce: Callable[[str], None],
              router: RouterSettings | None = None, objects: str | None = None,
              refuses_to_die: RefusesToDie = every_process_dies,
              limits: Limits = BUILT_IN, build_limits: BuildLimits | None = None,
              jobs_at_once: int = JOBS_AT_ONCE,
              acme: issuance.CertificateAuthority | None = None,
              frozen_budget: int | None = None, admin: AdminSettings | None = None) -> int:
    """Run the control plane until shutdown; returns the process exit code.

    A full disk at start (the lock, the router's records, the store) is said as such and
    exits EXIT_DISK_FULL, which `up` shows even when the log it goes to could not grow:
    the next `up` once there is room starts as usual (nothing was changed half-way).
    """
    try:
        return await _run_home(home, http_addr, demo, announce, router, objects,
                               refuses_to_die, limits, build_limits, jobs_at_once, acme,
                               frozen_budget, admin)
    except Exception as exc:  # a filter, not a catch-all: anything else goes on up
        if not disk_full(exc):
            raise
        log.warning("start: %s", exc)
        announce(f"error: {disk_full_message(exc)}")
        return EXIT_DISK_FULL


async def _run_home(home: Home, http_addr: str | None, demo: bool, announce: Callable[[str], None],
                    router: RouterSettings | None, objects: str | None,
                    refuses_to_die: RefusesToDie, limits: Limits,
                    build_limits: BuildLimits | None,
                    jobs_at_once: int = JOBS_AT_ONCE,
                    acme: issuance.CertificateAuthority | None = None,
                    frozen_budget: int | None = None,
                    admin: AdminSettings | None = None) -> int:
    home.ensure()
    try:
        lock_fd = _take_lock(home)
    except StartupError as exc:
        announce(f"error: {exc}")
        return exc.exit_code
    try:
        try:
            store_url = objects_url(home, objects)
            object_store = open_objects(store_url, home)
        except ObjectStoreError as exc:
            raise StartupError(f"--objects: {exc}", EXIT_FAILED) from exc
        return await _run_locked(home, _router_addr(home, http_addr), demo, announce,
                                 router or RouterSettings(), object_store, refuses_to_die,
                                 limits, build_limits, jobs_at_once, acme, frozen_budget,
                                 admin)
    except StartupError as exc:
        announce(f"error: {exc}")
        return exc.exit_code
    finally:
        os.close(lock_fd)


async def _run_locked(home: Home, http_addr: str, demo: bool,
                      announce: Callable[[str], None], settings: RouterSettings,
                      objects: ObjectStore | None, refuses_to_die: RefusesToDie,
                      limits: Limits, build_limits: BuildLimits | None,
                      jobs_at_once: int = JOBS_AT_ONCE,
                      acme: issuance.CertificateAuthority | None = None,
                      frozen_budget: int | None = None,
                      admin: AdminSettings | None = None) -> int:
    clock = SystemClock()
    # Before the router starts (it inherits the score): out of memory, the kernel kills
    # an app, never keelway (keelway/runtime/limits.py).
    if not protect_keelway():
        log.info("cannot lower keelway's OOM score (not root): the kernel may pick it")
    router = await _boot_router(home, http_addr, settings)
    http_port = router_process.parse_addr(http_addr)[1]
    sweep(home.builds_dir)
    if (cache := deps_cache.for_home(home.root)) is not None:
        cache.sweep()
    for directory in (home.router_dir, home.root / "env", home.root / "current"):
        sweep_temp(directory)
    store = SqliteStore(home.store_path, clock)
    owner = uuid.uuid4().hex[:12]
    parts: DeployParts

    async def on_exit(gen, code):  # type: ignore[no-untyped-def]
        await parts.restarts.on_exit(gen, code)

    supervisor = Supervisor(store, home, clock, on_exit, refuses_to_die=refuses_to_die,
                            limits=limits, build_limits=build_limits)
    if supervisor.identities.in_force:
        home.open_to_tenants()  # before anything of a tenant runs (keelway/identity.py)
    else:
        log.info("tenants share keelway's uid: %s", supervisor.identities.shared_because)
    publisher = Publisher(store, home.router_socket)
    parts = wire(store, home, supervisor, publisher, clock, owner, objects, jobs_at_once)
    deployer = parts.deployer
    await parts.boot()

    if demo:
        await _deploy_demo(home, store, deployer, announce)

    stopping = asyncio.Event()
    keep_apps = False

    def request_shutdown(keep: bool) -> None:
        nonlocal keep_apps
        keep_apps = keep
        stopping.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request_shutdown, False)

    async def push_routes() -> str | None:
        """The store's routes to a router the supervisor just started; why not if not
        (the router serves its saved table and the periodic pass pushes them again)."""
        try:
            await publisher.publish()
        except OperationError as exc:
            return exc.message
        return None

    router.watch(push_routes)
    https_port = (router_process.parse_addr(settings.https)[1]
                  if settings.https is not None else None)
    certifier = Certifier(store, home, parts.runner, acme, http_port, https_port)
    api = Api(store, home, deployer, parts.passes, http_port, request_shutdown, router,
              parts.parking, parts.apps, parts.instances, parts.domains, parts.seeding,
              parts.snapshots, parts.replication, parts.restore, parts.runs, parts.jobs,
              certifier, parts.freezing)
    # Open log streams (`logs -f`) must not hold a shutdown for long.
    runner = web.AppRunner(api.app(), access_log=None, handle_signals=False,
                           shutdown_timeout=2.0)
    await runner.setup()
    home.api_socket.unlink(missing_ok=True)  # stale: we hold the home lock
    old_umask = os.umask(0o077)
    try:
        site = web.UnixSite(runner, str(home.api_socket))
        await site.start()
    finally:
        os.umask(old_umask)
    os.chmod(home.api_socket, 0o600)
    run_server = RunServer(home, parts.runs)
    await run_server.start()
    admin_listener = await _start_admin(admin, store, home, router, http_port, parts, announce)
    rotation = loop.create_task(_rotate_logs_forever(home))
    periodic = loop.create_task(parts.passes.periodic())
    idle_sweep = loop.create_task(Sweep(store, parts.parking, home.router_socket, clock,
                                        freezing=parts.freezing,
                                        frozen_budget=frozen_budget).run())
    snapshot_schedule = loop.create_task(parts.snapshots.schedule())
    drills = loop.create_task(DrillSchedule(store, parts.replication, parts.snapshots,
                                            clock).run())
    job_schedule = loop.create_task(parts.jobs.schedule())
    cert_keeper = loop.create_task(certifier.keep())

    announce(f"keelway {'adopted' if router.handle.adopted else 'started'} the router on "
             f"http://{http_addr}/ (pid {router.handle.pid})")
    if settings.https is not None:
        announce(f"HTTPS on https://{settings.https}/ from the certificates in "
                 f"{home.certs_dir}" + (f", ordered from {acme.directory} as needed"
                                        if acme is not None else ""))
    announce(f"API on {home.api_socket}; state in {home.root}")
    # A few hosts say where to look; 10,000 of them would bury the lines around them.
    serving, shown = store.instances.list_instances(), 10
    for inst in serving[:shown]:
        announce(f"serving {inst.app}: http://{inst.host}:{http_port}/")
    if len(serving) > shown:
        apps = len({inst.app for inst in serving})
        announce(f"… and {len(serving) - shown} more instances of "
                 f"{apps} app{'' if apps == 1 else 's'} (`keelway status`)")
    announce("ready")

    await stopping.wait()
    announce("shutting down" + (" (apps keep running)" if keep_apps else ""))
    # First, while the store and the supervisor are whole: a run has no terminal once
    # this process is gone, so every one is hung up, stopped and journaled now.
    await run_server.close()
    job_schedule.cancel()
    cert_keeper.cancel()
    await parts.jobs.close()
    rotation.cancel()
    periodic.cancel()
    idle_sweep.cancel()
    snapshot_schedule.cancel()
    drills.cancel()
    if admin_listener is not None:
        await admin_listener.close()
    await runner.cleanup()
    home.api_socket.unlink(missing_ok=True)
    parts.passes.close()
    await parts.restarts.close()
    # A rollout carried on since boot stops where it stands: its journal keeps it
    # RUNNING, and the next boot carries it on again.
    for task in list(deployer.resuming):
        task.cancel()
    if not keep_apps:
        await _stop_all(store, supervisor, parts.keeper.replicas)
    await supervisor.shutdown()
    if not await router.stop(keep_serving=keep_apps):
        announce("warning: the router did not stop; it is still serving")
    store.close()
    return 0


async def _start_admin(admin: AdminSettings | None, store: Store, home: Home,
                       router: RouterSupervisor, http_port: int, parts: DeployParts,
                       announce: Callable[[str], None]) -> AdminListener | None:
    """The admin listener, when asked for (keelway/api/admin.py). One that cannot bind
    is said and left out: the apps and the API serve on without it."""
    if admin is None:
        return None
    listener = AdminListener(
        admin, Scraper(store, str(home.router_socket), admin.per_instance),
        Dashboard(store, home, router, http_port, lambda: set(parts.locks.live_ops),
                  parts.snapshots, parts.keeper.replicas))
    try:
        await listener.start()
    except OSError as exc:
        log.warning("admin listener on %s: %s", admin.addr, exc)
        announce(f"warning: cannot serve the admin listener on {admin.addr}: {exc}")
        return None
    announce(f"metrics on http://{admin.addr}/metrics, the dashboard on http://{admin.addr}/"
             + (" (token required)" if admin.token is not None else ""))
    return listener


async def _stop_all(store: Store, supervisor: Supervisor, replicas: Replicas | None) -> None:
    """Stop every process tree for `down`: the apps first (each after its service's
    stop_grace), so their databases take no more writes; then every replicator, and
    each instance's last sync (`_last_syncs`), so each replica is current with its
    stopped database. Instances stay `running`, so `up` restarts them (and their
    replicators)."""
    gens = store.generations.live_generations()
    apps = [g for g in gens if g.service != REPLICA]
    await asyncio.gather(*(supervisor.stop(g, targets.stop_grace_s(store, g)) for g in apps))
    replicators = [g for g in gens if g.service == REPLICA]
    grace = (replicas.options if replicas is not None else ReplicaOptions()).stop_grace_s
    await asyncio.gather(*(supervisor.stop(g, grace) for g in replicators))
    if replicas is not None and replicas.enabled:
        await _last_syncs(replicas, sorted({g.instance for g in replicators}))
    await supervisor.remove_strays()
    supervisor.trees.forget_home()


# `down`'s last syncs: this many at once, all finished within this long (the CLI waits
# 60 s for the whole shutdown, and the apps' stop graces come first). A sync that
# outlives the deadline is killed; its replica then lags, which the log says.
DOWN_SYNCS_AT_ONCE = 4
DOWN_SYNC_DEADLINE_S = 20.0


async def _last_syncs(replicas: Replicas, hosts: list[str]) -> None:
    """The last sync of each of `hosts`, whose apps and replicators are stopped:
    `Replicas.stop(host, sync=True)`, a few at once, each bounded by what is left of the
    deadline (litestream's process group is killed at its timeout: nothing outlives
    `down`)."""
    began = time.monotonic()
    deadline = began + DOWN_SYNC_DEADLINE_S
    gate = asyncio.Semaphore(DOWN_SYNCS_AT_ONCE)

    async def last_sync(host: str) -> str | None:
        async with gate:
            left = deadline - time.monotonic()
            if left <= 0:
                return "no time was left for its last sync"
            try:
                return await replicas.stop(
                    host, sync=True, timeout_s=min(left, replicas.options.command_timeout_s))
            except (OSError, ReplicaError) as exc:
                return str(exc)

    failed = await asyncio.gather(*(last_sync(h) for h in hosts))
    for host, why in zip(hosts, failed, strict=True):
        if why is not None:
            log.warning("down: the replica of %s may lag its database: %s", host, why)
    if hosts:
        log.info("down: %d of %d replicas synced in %.1f s", failed.count(None), len(hosts),
                 time.monotonic() - began)


async def _deploy_demo(home: Home, store: Store, deployer: Deployer,
                       announce: Callable[[str], None]) -> None:
    source = examples_dir() / "hello"
    if not source.is_dir():
        announce(f"warning: no demo app at {source}; skipping --demo")
        return
    announce(f"deploying the demo app from {source}")
    supervisor = deployer.supervisor
    staged = await asyncio.to_thread(stage, source, builds_dir=home.builds_dir, app=DEMO_APP,
                                     builder=supervisor.identities.builder(DEMO_APP),
                                     limits=supervisor.build_limits,
                                     confine=supervisor.build_cells())
    releases = store.builds.list_releases(DEMO_APP)
    if releases and releases[0].build_digest == staged.digest:
        announce("the demo is already deployed at this build")
        return
    try:
        await deployer.deploy(DEMO_APP, staged.digest, staged.path, [DEMO_HOST], announce)
    except OperationError as exc:
        announce(f"warning: demo deploy failed: {exc.message}")


def main(argv: list[str] | None = None,
         refuses_to_die: RefusesToDie = every_process_dies) -> int:
    """The daemon's entry point; `refuses_to_die` is the fail-closed tests' one seam
    (keelway/testing/daemon.py), never given in production."""
    parser = argparse.ArgumentParser(prog="keelway-daemon")
    parser.add_argument("--http", default=None,
                        help=f"where the router listens (default: where it already does, "
                             f"else {DEFAULT_HTTP})")
    parser.add_argument("--demo", action="store_true")
    parser.add_argument("--router-workers", type=int,
                        default=router_process.default_workers())
    parser.add_argument("--trusted-proxy", action="append", default=[])
    parser.add_argument("--hold-timeout", type=float, default=None)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--jobs-at-once", type=int, default=JOBS_AT_ONCE)
    parser.add_argument("--https", default=None,
                        help="where the router serves HTTPS, or `off` (default: where it "
                             "already does, if it does)")
    parser.add_argument("--frozen-budget", default=None)
    parser.add_argument("--admin", default=None,
                        help="where /metrics and the dashboard are served, or `off` "
                             "(default: where the last `up` asked, if it did)")
    parser.add_argument("--metrics-per-instance", action="store_true")
    parser.add_argument("--no-access-log", action="store_true",
                        help="the router writes no access log")
    parser.add_argument("--acme-directory", default=None)
    parser.add_argument("--acme-email", default=None)
    parser.add_argument("--acme-ca-bundle", default=None)
    parser.add_argument("--acme-challenge", default=None, choices=issuance.CHALLENGE_TYPES)
    parser.add_argument("--objects", default=None,
                        help="s3://BUCKET/PREFIX for snapshots (default: $KEELWAY_HOME/objects)")
    for name in ("memory", "cpu", "pids", "nofile"):
        parser.add_argument(f"--default-{name}", default=None)
    for name in ("memory", "timeout", "disk"):
        parser.add_argument(f"--build-{name}", default=None)
    args = parser.parse_args(argv)
    try:
        limits = box_limits(args.default_memory, args.default_cpu, args.default_pids,
                            args.default_nofile)
        build_limits = box_build_limits(args.build_memory, args.build_timeout,
                                        args.build_disk, apps_budget=apps_budget())
    except LimitError as exc:
        parser.error(str(exc))
    # Before anything is created: what this process, the router, build steps and the
    # apps create is then owner-only from its first instant (see keelway/home.py).
    os.umask(PRIVATE_UMASK)
    try:
        https = _https_addr(Home.from_env(), args.https)
    except ValueError as exc:
        parser.error(f"--https: {exc}")
    try:
        frozen = frozen_budget_bytes(args.frozen_budget, apps_budget())
    except LimitError as exc:
        parser.error(str(exc))
    acme = _authority(Home.from_env(), args.acme_directory, args.acme_email,
                      args.acme_ca_bundle, args.acme_challenge)
    try:
        admin = admin_settings(Home.from_env(), args.admin, dict(os.environ),
                               args.metrics_per_instance)
    except (ValueError, admin_access.AdminAccessError) as exc:
        parser.error(f"--admin: {exc}")
    settings = RouterSettings(max(1, args.router_workers), tuple(args.trusted_proxy),
                              args.hold_timeout, args.max_concurrency, https,
                              on_demand=https is not None and acme is not None,
                              access_log=not args.no_access_log)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvloop

    # Unbuffered, as `python -u`: a line a full disk refuses is lost, not kept in a
    # buffer whose flush at exit would fail again and turn the exit code into 120.
    sys.stdout = io.TextIOWrapper(io.FileIO(sys.stdout.fileno(), "w", closefd=False),
                                  encoding=sys.stdout.encoding, errors=sys.stdout.errors,
                                  write_through=True)

    def announce(message: str) -> None:
        try:
            print(message, flush=True)
        except OSError as exc:
            if not disk_full(exc):  # a full disk drops the line; the exit code says it
                raise

    # A read apart from the loop (`status`, Store.read_apart) gives the GIL back at each
    # row SQLite steps and must win it back from a busy loop: at the default 5 ms a
    # handover, a thousand instances' rows took a second. At 0.5 ms the loop pays a
    # few more switches a second.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    with contextlib.suppress(KeyboardInterrupt):
        return uvloop.run(run(Home.from_env(), args.http, args.demo, announce, settings,
                              args.objects, refuses_to_die, limits, build_limits,
                              max(1, args.jobs_at_once), acme, frozen, admin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
