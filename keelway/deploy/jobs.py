"""Scheduled jobs (`[jobs.NAME]` in keelway.toml; SPEC §4 Jobs, issue #20): when each
run falls due, and each run as a journaled one-off operation.

A run is a generation of service `job.NAME` in the build of the release its instance
serves next (a parked one's pending release, else ACTIVE's), with the instance's whole
environment and uid, as `keelway run` runs (keelway/deploy/runs.py); its output goes to
its own log (`keelway logs APP --service job.NAME`), its outcome to the journal, events
and `keelway jobs APP`.

Rules it keeps:
- **Never twice.** A run is an operation of kind `job` keyed `job:NAME@<scheduled time>`
  on its instance. The key is unique per instance in the store, and the run checks it
  under the instance lock before it begins (`_not_begun`), so whatever the scheduler
  computes again (after a crash, a refresh, a catch-up), one scheduled time of one job
  starts at most one process on one instance. The operation is begun, durably, before
  its spawn step, and a crash anywhere after that ends it at boot, failed as
  interrupted, with its process removed as a stray (invariant 5): it is not run again,
  since it may have done part of its work. At most once, never at least once.
- **The cursor.** What the scheduler has dealt with, per job and instance, is the newest
  scheduled time with an operation, read once at boot (`keyed_operations`); fires after it
  are due. One newer than `ON_TIME_S` past its start is missed (keelway was down, or
  busy): `missed` says whether none, the latest or each of those within `missed_window`
  runs. A job or instance the scheduler has not seen before starts from now: nothing
  before it counts as missed.
- **Overlap.** While a job's run on an instance is under way (waiting for the box's
  gate included), the next one is skipped, queued behind it, or replaces it (the
  running one stopped, its operation failed as replaced). Catch-up runs of
  `missed = "all"` always queue: they are each to run.
- **Density.** Each run starts at its time plus a jitter within the job's `spread`,
  fixed by a hash of the run, so a recomputation never moves it; at most
  `jobs_at_once` runs are under way on the box at once (`keelway up --jobs-at-once`).
- **Parked instances** run a job without waking (the run's process is the instance's
  only one while it runs) unless the job says `wake = true`; a fenced or down instance
  runs none (the run is refused before anything is journaled, and said in events).
- The scheduler reads the clock it is given, so a test's midnight passes at once.

Crash windows (each in the crash matrix's `job` scenario): before the run's operation
begins, nothing was journaled and the run is due again at boot (on time or as a
catch-up); after it, the operation is ended at boot as interrupted and the run is not
started again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import heapq
import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from keelway import failpoints, names
from keelway.builds.errors import BuildError
from keelway.builds.manifest import JobSpec, Missed, Overlap, Reach, load_manifest
from keelway.clock import Clock
from keelway.deploy import targets
from keelway.deploy.errors import NotFoundError, OperationError, UserError, checked
from keelway.deploy.generation_start import layered_config
from keelway.deploy.operation import Bound, Plan, PlannedStep, Runner, Spec
from keelway.deploy.parking import Parking
from keelway.deploy.runs import HANGUP_GRACE_S, finalize_run, refusal
from keelway.deploy.steps import Done, Failed
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.runtime.environment import process_env
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState, InstanceState
from keelway.store.records import Generation, Operation

log = logging.getLogger("keelway.jobs")

failpoints.declare("job.spawn.before", "job.spawn.after", "job.exit.before", "job.exit.after")

JOBS_AT_ONCE = 8
TICK_S = 1.0
# How often the jobs each instance's build declares are read again (a deploy adds some).
REFRESH_S = 10.0
# A run that starts up to this long after its time (its jitter included) is on time;
# later than that it was missed, and `missed` decides.
ON_TIME_S = 120.0
# How far back boot reads runs for the cursors: the longest missed window a job may
# sensibly have, plus a week, so a weekly job's last run is seen.
LOOK_BACK_S = 8 * 24 * 3600.0
# Runs queued behind one job's run on one instance; past this, a due run is skipped.
MAX_QUEUED = 100
_KEY = re.compile(r"job:(?P<job>[a-z][a-z0-9_-]*)@(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\dZ)")
_KEY_TIME = "%Y-%m-%dT%H:%MZ"


def run_key(job: str, scheduled: datetime) -> str:
    """The journal key of one scheduled run (unique per instance): minutes suffice, as a
    cron schedule fires on whole minutes."""
    return f"job:{job}@{scheduled.astimezone(UTC).strftime(_KEY_TIME)}"


def by_hand_key(job: str, now: float) -> str:
    return f"job:{job}@by-hand-{now:.6f}"


def parse_key(key: str) -> tuple[str, datetime] | None:
    """(job, scheduled time) of a scheduled run's key; None for a run by hand."""
    found = _KEY.fullmatch(key)
    if found is None:
        return None
    at = datetime.strptime(found.group("at"), _KEY_TIME).replace(tzinfo=UTC)
    return found.group("job"), at


def job_of_key(key: str) -> str | None:
    """The job a run's key names, by hand or scheduled."""
    if not key.startswith("job:") or "@" not in key:
        return None
    return key[len("job:"):key.index("@")]


def jitter_s(spec: JobSpec, host: str, scheduled: datetime) -> float:
    """Where in its job's spread one run starts: a hash of the run, so every
    computation (before and after a crash) puts it at the same moment."""
    if spec.spread_s <= 0:
        return 0.0
    digest = hashlib.sha256(f"{spec.name}\0{host}\0{scheduled.isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 * spec.spread_s


@dataclass(frozen=True)
class Due:
    """One run to start: scheduled (`scheduled` set) or by hand."""

    app: str
    host: str
    spec: JobSpec
    scheduled: datetime | None
    start_at: float
    catch_up: bool = False

    @property
    def key(self) -> str:
        assert self.scheduled is not None
        return run_key(self.spec.name, self.scheduled)

    @property
    def said(self) -> str:
        if self.scheduled is None:
            return f"{self.spec.name} (by hand)"
        at = self.scheduled.strftime("%Y-%m-%d %H:%M UTC")
        return f"{self.spec.name} of {at}" + (" (catching up)" if self.catch_up else "")


@dataclass(frozen=True)
class Falling:
    """What falls due for one job on one instance between its cursor and now."""

    runs: tuple[Due, ...]
    skipped: int  # missed runs not run (their policy, or past the window)


def due_between(app: str, host: str, spec: JobSpec, cursor: datetime, now: datetime
                ) -> tuple[Falling, datetime]:
    """The runs of `spec` on `host` after `cursor` up to `now`, by the on-time and
    missed rules; and the new cursor. Pure: the scheduler's one rule of time."""
    fires = spec.schedule.between(cursor, now, 10_000)
    if not fires:
        return Falling((), 0), cursor
    stamp = now.timestamp()
    on_time: list[Due] = []
    missed: list[datetime] = []
    for fire in fires:
        start = fire.timestamp() + jitter_s(spec, host, fire)
        if stamp <= start + ON_TIME_S:
            on_time.append(Due(app, host, spec, fire, start))
        else:
            missed.append(fire)
    window = [f for f in missed if stamp - f.timestamp() <= spec.missed_window_s]
    match spec.missed:
        case Missed.SKIP:
            chosen: list[datetime] = []
        case Missed.ONCE:
            chosen = window[-1:]
        case Missed.ALL:
            chosen = window[-100:]
    catch_up = [Due(app, host, spec, fire, stamp + jitter_s(spec, host, fire), catch_up=True)
                for fire in chosen]
    return Falling((*catch_up, *on_time), len(missed) - len(chosen)), fires[-1]


# -- one run, as an operation -----------------------------------------------------------


@dataclass(frozen=True)
class JobRequest:
    host: str
    job: str
    key: str


class AlreadyBegun(OperationError):
    """The run of this key on this instance was begun before (never twice)."""

    code = "already-begun"


@dataclass(eq=False)
class _JobRun:
    jobs: Jobs
    due: Due
    gen: Generation | None = None
    exited: asyncio.Future[int | None] | None = None
    replaced_by: str | None = None
    release: int = 0

    async def spawn(self, op: Operation) -> Done:
        jobs, due = self.jobs, self.due
        inst = targets.instance_named(jobs.store, due.host)
        target = refusal(jobs.store, inst)
        spec = target.manifest.jobs.get(due.spec.name)
        if spec is None:
            raise UserError(f"v{target.release} of {inst.app} has no job {due.spec.name}")
        gen = jobs.store.plan_generation(
            app=inst.app, instance=inst.host, service=spec.service, release=target.release,
            build_digest=target.build_digest, op_id=op.id, port=None)
        env = process_env(
            home=jobs.home, app=inst.app, instance=inst.host, service=spec.service,
            release=target.release, generation=gen.id, port=None,
            config=layered_config(jobs.store, inst.host, target.config),
            build_path=target.build_path)
        env["KEELWAY_JOB"] = spec.name
        if due.scheduled is not None:
            env["KEELWAY_JOB_SCHEDULED"] = due.scheduled.strftime("%Y-%m-%dT%H:%M:%SZ")
        jobs.home.data_dir(inst.host).mkdir(parents=True, exist_ok=True)
        self.gen = await jobs.supervisor.spawn_job(gen, spec.command, target.build_path, env)
        # Taken at once: a command that ends at once is buried by its watcher, and its
        # code is then read from the record.
        self.exited = asyncio.ensure_future(
            jobs.supervisor.wait_exit(self.gen, spec.timeout_s, HANGUP_GRACE_S))
        self.release = target.release
        pid = jobs.store.local.presence(self.gen.id).pid
        jobs.store.ops.add_event("job", f"{due.said} started in v{target.release} "
                                 f"(generation {self.gen.id}, pid {pid})",
                                 app=inst.app, instance=inst.host)
        return Done(f"generation {self.gen.id} pid {pid}")

    async def wait(self, _op: Operation) -> Done | Failed:
        """Its exit, the instance lock lent out meanwhile (a job may run for hours;
        deploys, parks and stops of the instance go on)."""
        gen, exited, jobs = self.gen, self.exited, self.jobs
        assert gen is not None and exited is not None
        async with jobs.runner.lent(self.due.host):
            returncode = await exited
        latest = jobs.store.generations.get_generation(gen.id)
        if latest is None or latest.state is not GenState.GONE:
            return Failed(f"{self.due.spec.name} left processes that could not be stopped")
        name, cause = self.due.spec.name, latest.exit_cause
        if self.replaced_by is not None:
            return Failed(f"{name} was stopped: replaced by the run {self.replaced_by}")
        if returncode is None:
            # Still running at its deadline (then stopped): the one way our own child's
            # exit goes unread.
            timeout = self.due.spec.timeout_s
            return Failed(f"{name} ran past its timeout of {timeout:g}s and was stopped"
                          if timeout is not None else f"{name} was stopped")
        code = returncode
        if cause:
            return Failed(f"{name} killed: {cause}")
        if code != 0:
            said = f"signal {-code}" if code < 0 else f"code {code}"
            return Failed(f"{name} exited with {said}")
        return Done("exit code 0")

    async def stop(self, by: str) -> None:
        """Stop this run for the one that replaces it (`overlap = "replace"`)."""
        self.replaced_by = by
        if self.gen is not None:
            latest = self.jobs.store.generations.get_generation(self.gen.id) or self.gen
            await self.jobs.supervisor.stop(latest, HANGUP_GRACE_S)


def plan_job(store: Store, request: JobRequest) -> Plan:
    """A run's plan: its process spawned in the release the instance serves next, then
    waited for. Refused (UserError), nothing written, when the instance is fenced,
    down, or runs no release."""
    inst = targets.instance_named(store, request.host)
    target = refusal(store, inst)
    service = f"job.{request.job}"
    return Plan(OpKind.JOB, inst.app, inst.host, (
        PlannedStep(StepKind.RUN, f"spawn job {request.job} in v{target.release} "
                    f"({target.build_digest[:12]})", "spawn",
                    before=("job.spawn.before",), after=("job.spawn.after",),
                    service=service, detail=request.key),
        PlannedStep(StepKind.RUN_EXIT, "wait for it to exit, the instance lock lent out",
                    "wait", before=("job.exit.before",), after=("job.exit.after",),
                    service=service)))


async def _not_begun(one: _JobRun, request: JobRequest) -> None:
    """Under the instance lock, before anything is written: a key begun before is never
    begun again (the store's unique key would refuse it too, as a conflict)."""
    if one.jobs.store.ops.find_operation_by_key(request.host, request.key) is not None:
        raise AlreadyBegun(f"{request.key} on {request.host} was begun before")


def _spawn(one: _JobRun, _request: JobRequest, _step: PlannedStep) -> Bound:
    return one.spawn


def _wait(one: _JobRun, _request: JobRequest, _step: PlannedStep) -> Bound:
    return one.wait


JOB: Spec[JobRequest, _JobRun] = Spec(
    OpKind.JOB, plan_job, {"spawn": _spawn, "wait": _wait}, prelude=_not_begun,
    finalize=finalize_run, orphaned=True)


# -- the scheduler -----------------------------------------------------------------------


@dataclass
class _Track:
    """One job on one instance: its spec as the instance's build declares it, and the
    newest scheduled time dealt with."""

    app: str
    host: str
    spec: JobSpec
    cursor: datetime
    next_fire: float


@dataclass(eq=False)
class Jobs:
    """The scheduler and its runs: one loop for every job of every instance."""

    store: Store
    home: Home
    supervisor: Supervisor
    runner: Runner
    parking: Parking
    clock: Clock
    jobs_at_once: int = JOBS_AT_ONCE
    _tracks: dict[tuple[str, str], _Track] = field(default_factory=dict)
    _pending: list[tuple[float, int, Due]] = field(default_factory=list)
    _seq: int = 0
    _running: dict[tuple[str, str], _JobRun | None] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _queued: dict[tuple[str, str], collections.deque[Due]] = field(default_factory=dict)
    _manifests: dict[tuple[str, str], dict[str, JobSpec]] = field(default_factory=dict)
    _cursors: dict[tuple[str, str], datetime] | None = None
    _newest: dict[tuple[str, str], datetime] = field(default_factory=dict)
    _refreshed_at: float = float("-inf")
    _gate: asyncio.Semaphore | None = None

    # -- the loop ------------------------------------------------------------------------

    async def schedule(self) -> None:
        """The one loop that starts due runs (the daemon runs it)."""
        while True:
            try:
                self.tick()
            except Exception:
                # The loop outlives any one pass: the next tick tries again.
                log.exception("job schedule pass failed")
            await self.clock.sleep(TICK_S)

    def tick(self) -> list[Due]:
        """One pass: the tracks refreshed if it is time, due runs found, and every run
        whose start has come dispatched. Returns the runs dispatched."""
        now = self.clock.now()
        if now - self._refreshed_at >= REFRESH_S:
            self.refresh()
        at = datetime.fromtimestamp(now, UTC)
        skipped: collections.Counter[tuple[str, str]] = collections.Counter()
        for track in self._tracks.values():
            if track.next_fire > now:
                continue
            decision, track.cursor = due_between(track.app, track.host, track.spec,
                                                 track.cursor, at)
            track.next_fire = track.spec.schedule.next_after(track.cursor).timestamp()
            for due in decision.runs:
                self._push(due)
            if decision.skipped:
                skipped[(track.app, track.spec.name)] += decision.skipped
        for (app, job), count in skipped.items():
            self.store.ops.add_event("job", f"{job}: {count} run{'s' if count > 1 else ''} "
                                     "missed while keelway was down or busy, not run "
                                     "(its `missed` and `missed_window`)", app=app)
        started = []
        while self._pending and self._pending[0][0] <= now:
            _, _, due = heapq.heappop(self._pending)
            self.dispatch(due)
            started.append(due)
        return started

    def _push(self, due: Due) -> None:
        self._seq += 1
        heapq.heappush(self._pending, (due.start_at, self._seq, due))

    def refresh(self) -> None:
        """Which jobs each instance runs, from the build it runs (each build's manifest
        read once: a build never changes); the cursors from the journal at the first."""
        now = self.clock.now()
        # A job that appeared since the last refresh (a deploy brought it) is deemed to
        # exist since then, so a time of it that fell between is run, not lost; at boot,
        # one with no run in the journal starts from now.
        booting = self._cursors is None
        since = now if booting else self._refreshed_at
        self._refreshed_at = now
        if self._cursors is None:
            self._cursors, self._newest = self._journaled_cursors(now)
        wanted = self._wanted()
        for key in [k for k in self._tracks if k not in wanted]:
            del self._tracks[key]
        at = datetime.fromtimestamp(since, UTC)
        for key, (app, spec, created_at) in wanted.items():
            have = self._tracks.get(key)
            if have is not None and have.spec == spec:
                continue
            if have is not None:
                cursor = have.cursor  # a new release's spec goes on from where it was
            else:
                journaled = self._cursors.pop(key, None)
                cursor = at if journaled is None else journaled
                newest = self._newest.get((app, spec.name))
                if booting and journaled is None and newest is not None:
                    # No run of it here yet, but the app's other instances ran it: the
                    # newest of those times is due here too (a crash during a spread
                    # cut this one's short), unless the instance is younger than it.
                    cursor = max(newest - timedelta(seconds=1),
                                 datetime.fromtimestamp(created_at, UTC))
            self._tracks[key] = _Track(app, key[0], spec, cursor,
                                       spec.schedule.next_after(cursor).timestamp())

    def _journaled_cursors(self, now: float) -> tuple[dict[tuple[str, str], datetime],
                                                      dict[tuple[str, str], datetime]]:
        """The newest scheduled time journaled per (host, job), and per (app, job)."""
        cursors: dict[tuple[str, str], datetime] = {}
        newest: dict[tuple[str, str], datetime] = {}
        for op in self.store.ops.keyed_operations(OpKind.JOB, now - LOOK_BACK_S):
            parsed = parse_key(op.key or "")
            if parsed is None:
                continue
            job, scheduled = parsed
            for found, key in ((cursors, (op.instance, job)), (newest, (op.app, job))):
                if key not in found or found[key] < scheduled:
                    found[key] = scheduled
        return cursors, newest

    def _wanted(self) -> dict[tuple[str, str], tuple[str, JobSpec, float]]:
        """(host, job) -> (app, spec, the instance's creation) for every job an
        instance's build declares; an app-wide job (`instances = "one"`) on its first
        instance by name that may run it (not fenced, not down)."""
        store = self.store
        digest: dict[str, tuple[str, str]] = {}
        for gen in store.generations.active_generations():
            if gen.instance not in digest or gen.service == "web":
                digest[gen.instance] = (gen.app, gen.build_digest)
        wanted: dict[tuple[str, str], tuple[str, JobSpec, float]] = {}
        chosen: set[tuple[str, str]] = set()
        # Instances added parked run what their first wake will: the release pending.
        releases: dict[tuple[str, int], str | None] = {}
        for inst in sorted(store.instances.list_instances(), key=lambda i: (i.app, i.host)):
            if inst.host not in digest and inst.pending_release is not None:
                number = (inst.app, inst.pending_release)
                if number not in releases:
                    pending = store.builds.get_release(*number)
                    releases[number] = pending.build_digest if pending is not None else None
                if (found := releases[number]) is not None:
                    digest[inst.host] = (inst.app, found)
            if inst.host not in digest:
                continue
            for spec in self._jobs_of(*digest[inst.host]).values():
                if spec.instances is Reach.ONE:
                    if (inst.app, spec.name) in chosen or not self._may_run(inst.host):
                        continue
                    chosen.add((inst.app, spec.name))
                wanted[(inst.host, spec.name)] = (inst.app, spec, inst.created_at)
        return wanted

    def _may_run(self, host: str) -> bool:
        inst = self.store.instances.get_instance(host)
        return (inst is not None and inst.state is not InstanceState.DOWN
                and not self.store.instances.fenced(host))

    def _jobs_of(self, app: str, digest: str) -> dict[str, JobSpec]:
        key = (app, digest)
        if key not in self._manifests:
            path = targets.build_path(self.store, app, digest)
            try:
                self._manifests[key] = load_manifest(path).jobs if path else {}
            except (BuildError, OSError):
                self._manifests[key] = {}  # it was deployed, so this is a build gone bad
        return self._manifests[key]

    # -- dispatch ------------------------------------------------------------------------

    def dispatch(self, due: Due) -> None:
        """Start `due`, or apply its job's overlap rule if a run of it is under way."""
        key = (due.host, due.spec.name)
        if key in self._running:
            overlap = Overlap.QUEUE if due.catch_up else due.spec.overlap
            match overlap:
                case Overlap.SKIP:
                    self._said(due, f"{due.said} skipped: its previous run is still "
                               "under way (overlap = skip)")
                    return
                case Overlap.QUEUE:
                    queue = self._queued.setdefault(key, collections.deque())
                    if len(queue) >= MAX_QUEUED:
                        self._said(due, f"{due.said} skipped: {MAX_QUEUED} runs are queued "
                                   "already")
                        return
                    queue.append(due)
                    return
                case Overlap.REPLACE:
                    self._queued[key] = collections.deque([due])
                    current = self._running[key]
                    if current is not None:
                        task = asyncio.get_running_loop().create_task(current.stop(due.said))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                    return
        self._start(due)

    def _start(self, due: Due) -> None:
        key = (due.host, due.spec.name)
        self._running[key] = None
        task = asyncio.get_running_loop().create_task(self._run(due),
                                                      name=f"job-{due.spec.name}-{due.host}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, due: Due) -> None:
        key = (due.host, due.spec.name)
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.jobs_at_once)
        try:
            async with self._gate:
                await self.run_one(due)
        except OperationError as exc:
            self._said(due, f"{due.said} not run: {exc.message}")
        except Exception:
            log.exception("job run %s on %s failed", due.said, due.host)
        finally:
            self._running.pop(key, None)
            queue = self._queued.get(key)
            if queue:
                self._start(queue.popleft())
            if queue is not None and not queue:
                self._queued.pop(key, None)

    async def run_one(self, due: Due) -> None:
        """One run, as its operation: woken first if its job says so, refused with
        nothing journaled when the instance may not run it or ran it before."""
        key = (due.host, due.spec.name)
        inst = targets.instance_named(self.store, due.host)
        if due.spec.wake and inst.state is InstanceState.PARKED:
            await self.parking.wake(due.host)
        one = _JobRun(self, due)
        self._running[key] = one
        run_key_ = (due.key if due.scheduled is not None
                    else by_hand_key(due.spec.name, self.clock.now()))
        await self.runner.run(JOB, one, JobRequest(due.host, due.spec.name, run_key_),
                              key=run_key_)

    def _said(self, due: Due, message: str) -> None:
        log.info("%s: %s", due.host, message)
        self.store.ops.add_event("job", message, app=due.app, instance=due.host)

    # -- by hand and views ---------------------------------------------------------------

    def run_now(self, app: str, job: str, host: str | None) -> list[str]:
        """`keelway jobs run APP NAME [--instance H]`: a run of `job` now on each
        instance that runs it (or on `host`), by the job's overlap rule; the hosts it
        was dispatched to. NotFoundError when nothing of the app runs such a job."""
        checked(names.APP, app)
        targets.instances_of(self.store, app, host)  # NotFoundError for either name
        self.refresh()
        tracks = [t for t in self._tracks.values()
                  if t.app == app and t.spec.name == job and (host is None or t.host == host)]
        if not tracks:
            known = sorted({t.spec.name for t in self._tracks.values() if t.app == app})
            where = f" on {host}" if host is not None else ""
            raise NotFoundError(f"{app} has no job {job!r}{where}",
                                hint=(f"its jobs: {', '.join(known)}" if known
                                      else "declare one in keelway.toml as [jobs.NAME]"))
        now = self.clock.now()
        for track in tracks:
            self.dispatch(Due(app, track.host, track.spec, None, now))
        return sorted(t.host for t in tracks)

    def listing(self, app: str) -> dict[str, object]:
        """What `keelway jobs APP` shows: each job as its instances' builds declare it,
        when it runs next, and the app's recent runs (newest first)."""
        checked(names.APP, app)
        targets.instances_of(self.store, app, None)
        self.refresh()
        by_job: dict[str, list[_Track]] = {}
        for track in self._tracks.values():
            if track.app == app:
                by_job.setdefault(track.spec.name, []).append(track)
        jobs = []
        for name, tracks in sorted(by_job.items()):
            spec = tracks[0].spec
            jobs.append({
                "name": name, "schedule": spec.schedule.expression,
                "describe": spec.schedule.describe(),
                "timezone": spec.schedule.zone.key, "instances": spec.instances.value,
                "overlap": spec.overlap.value, "missed": spec.missed.value,
                "missed_window_s": spec.missed_window_s, "wake": spec.wake,
                "spread_s": spec.spread_s, "timeout_s": spec.timeout_s,
                "hosts": sorted(t.host for t in tracks),
                "next_run": min(t.next_fire for t in tracks),
                "running": sorted(t.host for t in tracks
                                  if (t.host, name) in self._running)})
        return {"app": app, "jobs": jobs, "runs": runs_of(self.store, app,
                                                          self.clock.now() - LOOK_BACK_S)}

    async def close(self) -> None:
        """Stop dispatching; runs under way are left to the shutdown's stop of every
        process (or, keeping the apps, to the next boot, which ends them as
        interrupted)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def runs_of(store: Store, app: str, since: float, limit: int = 100) -> list[dict[str, object]]:
    """The app's runs begun since `since`, newest first, as `keelway jobs` lists them."""
    runs: list[dict[str, object]] = []
    for op in reversed(store.ops.keyed_operations(OpKind.JOB, since, app=app)):
        parsed = parse_key(op.key or "")
        runs.append({
            "job": job_of_key(op.key or ""), "instance": op.instance, "operation": op.id,
            "scheduled": parsed[1].timestamp() if parsed else None,
            "by_hand": parsed is None, "state": op.state.value, "error": op.error,
            "started_at": op.created_at, "finished_at": op.finished_at})
        if len(runs) >= limit:
            break
    return runs
