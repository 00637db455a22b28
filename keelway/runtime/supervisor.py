"""The supervisor: runs generations and watches them until they are proven gone.

It owns the process handles of this control plane and nothing else; what a generation
*should* be is the deployer's business. Rules it keeps:
- A generation's row (with its port claim) is written before its spawn, and its pid and
  start time right after, before anything waits on it or routes to it.
- A generation is its whole process tree (runtime.tree): it is recorded gone only when
  every process of that tree is proven dead (reaped, or pid + start time dead), and its
  cgroup is removed before the record says so. A leader that exits while descendants
  live (a daemonizing app) has them killed at once, as systemd's control-group mode
  does: the generation ended, and what it left behind must not hold its key or port.
- An unexpected exit is reported to `on_exit` once; the caller decides whether to
  restart (published generations of running instances) with backoff.
- A tenant's generation runs as its instance's uid where keelway/identity.py says so
  (runtime.identities hands it its files at the spawn); the replicator runs as root.
- Adoption: after a control-plane restart, generations that are still alive are
  watched by polling /proc, since they are no longer our children.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from keelway import failpoints
from keelway.clock import Clock
from keelway.home import Home
from keelway.limits import BUILT_IN, BuildLimits, Limits, box_build_limits
from keelway.runtime import process, tree
from keelway.runtime.health import Answered, NotListening, Probe, describe, listening_on, probe_http
from keelway.runtime.identities import Identities
from keelway.runtime.limits import tenant_bounds
from keelway.runtime.logs import log_path
from keelway.runtime.shell import shell_argv
from keelway.runtime.tree import ProcessTrees
from keelway.store import Store
from keelway.store.lifecycle import GenState
from keelway.store.records import Generation

log = logging.getLogger("keelway.supervisor")

failpoints.declare("spawn.before", "spawn.after", "spawn.recorded", "stop.before", "stop.after",
                   "cgroup.created", "cgroup.remove.before", "cgroup.remove.after")


class ReadyOutcome(enum.Enum):
    READY = "ready"
    EXITED = "exited"
    TIMED_OUT = "timed-out"


@dataclass(frozen=True)
class Readiness:
    outcome: ReadyOutcome
    # READY: what made it ready; EXITED and TIMED_OUT: why it is not, as a person reads it.
    said: str


_PROBE_TIMEOUT_S = 1.0
_PROBE_FIRST_S = 0.001
_PROBE_REFUSED_EVERY_S = 0.001
_PROBE_FAILING_EVERY_S = 0.1


class SettleOutcome(enum.Enum):
    GOOD = "good"
    # A clean exit inside the window: a one-shot's success.
    COMPLETED = "completed"
    CRASHED = "crashed"


ExitCallback = Callable[[Generation, int | None], Awaitable[None]]


@dataclass
class _Handle:
    gen_id: int
    pid: int
    start_ticks: int
    proc: process.Reapable | None
    # Set while keelway itself is stopping the process: its exit is then expected.
    stopping: bool = False
    # `stop`'s own stop of the tree, while it runs: a leader that dies of its SIGTERM
    # (a shell that ran the app as its child) leaves the rest of the tree to it, so
    # the app still gets its grace (runtime.shell).
    stopping_tree: asyncio.Future[bool] | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    watcher: asyncio.Task[None] | None = None


def every_process_dies(generation_id: int) -> bool:
    """The box as it is: SIGKILL ends every process keelway starts."""
    return False


# Whether a generation's process outlives every signal while alive (a process stuck in
# the kernel would): the danger `remove` must fail closed on. Production passes nothing;
# the fail-closed tests inject one (keelway/testing/danger.py).
RefusesToDie = Callable[[int], bool]


# How many spawns may start in one turn of the event loop. A vfork-style start holds the
# loop some 0.2 ms; the fallback's fork (runtime.process) holds it until the child has
# exec'd, some 13 ms for a control plane holding a thousand instances, so a cohort of 200
# starting at once would hold every request (a `status`, a wake) for seconds. Past this
# many, a spawn waits for the next turn, and what else is ready runs between. Spawns are
# no slower in sum: the loop does the same starts.
FORKS_AT_ONCE = 8


class Supervisor:
    def __init__(self, store: Store, home: Home, clock: Clock, on_exit: ExitCallback,
                 trees: ProcessTrees | None = None,
                 refuses_to_die: RefusesToDie = every_process_dies,
                 limits: Limits = BUILT_IN, build_limits: BuildLimits | None = None) -> None:
        """`limits`: the box's defaults for every tenant's process tree, each one a
        service does not set itself; `build_limits`: the box's for every build, each
        one's default and ceiling (keelway/limits.py)."""
        self.store = store
        self.limits = limits.over(BUILT_IN)
        self.build_limits = (build_limits or BuildLimits()).over(
            box_build_limits(apps_budget=tree.apps_budget()))
        self.refuses_to_die = refuses_to_die
        self.home = home
        self.identities = Identities(store, home)
        self.clock = clock
        self.on_exit = on_exit
        self.trees = trees or ProcessTrees.choose(home.root)
        log.info("process trees: %s", self.trees.describe())
        self._handles: dict[int, _Handle] = {}
        # Builds left by a control plane that died mid-build, before any build can run.
        if swept := self.trees.sweep_build_cells():
            log.info("removed %d build cgroups left by a crash", len(swept))
        self._forking = asyncio.Semaphore(FORKS_AT_ONCE)

    def build_cells(self) -> Callable[[int], tree.BuildCell] | None:
        """What puts each build step in a cgroup of its own with a memory limit
        (keelway/builds/build_step.py's Confine); None where there are no cgroups."""
        return self.trees.build_cell if self.trees.uses_cgroups else None

    # -- spawn -----------------------------------------------------------------------

    async def spawn(
        self, gen: Generation, command: str, cwd: Path, env: dict[str, str],
        limits: Limits | None = None,
    ) -> Generation:
        """Start a PLANNED generation; returns it RUNNING with pid and start time recorded.

        Crash between the spawn and the record: the process runs with no pid in the
        journal; it is in the generation's cgroup and carries KEELWAY_GENERATION and
        KEELWAY_SUPERVISOR in its environment, which is how the reconciler finds and
        removes its tree. Crash after the cgroup is made, before the spawn: an empty
        cgroup of a PLANNED generation, removed with it.
        """
        return await self._spawn(gen, shell_argv(command), cwd, env, None, tenant=True,
                                 limits=(limits or Limits()).over(self.limits))

    async def spawn_argv(self, gen: Generation, argv: list[str], cwd: Path,
                         env: dict[str, str]) -> Generation:
        """Start a PLANNED generation of keelway's own program `argv` (no shell): the
        instance's replicator. Its tree, record, crash windows and exit: `spawn`."""
        return await self._spawn(gen, argv, cwd, env, None)

    async def spawn_attached(self, gen: Generation, argv: list[str], cwd: Path,
                             env: dict[str, str], stdio: tuple[int, int, int]) -> Generation:
        """Start a PLANNED generation of a one-off run: `argv` as given (no shell), with
        `stdio` (a terminal lent by `keelway run`) as its stdin, stdout and stderr. It is
        a generation like any other (its tree, its record, its crash windows: `spawn`);
        its exit is its caller's to read (`wait_exit`), never a crash to restart."""
        return await self._spawn(gen, argv, cwd, env, stdio, expected_exit=True,
                                 tenant=True, limits=self.limits)

    async def spawn_job(self, gen: Generation, command: str, cwd: Path,
                        env: dict[str, str]) -> Generation:
        """Start a PLANNED generation of a scheduled job's run: `command` as a Procfile
        line runs, its output in its own log, under the box's default limits. Its exit is
        its caller's to read (`wait_exit`), never a crash to restart."""
        return await self._spawn(gen, shell_argv(command), cwd, env, None, expected_exit=True,
                                 tenant=True, limits=self.limits)

    async def _spawn(self, gen: Generation, argv: list[str], cwd: Path, env: dict[str, str],
                     stdio: tuple[int, int, int] | None, expected_exit: bool = False,
                     tenant: bool = False, limits: Limits | None = None) -> Generation:
        """`tenant`: the app's own process, run as its instance's identity under
        `limits`; otherwise keelway's own program (the replicator), run as keelway. The
        hand-over of the instance's files (runtime.identities) is idempotent and lies
        inside the window `spawn.before` .. `cgroup.created`: a crash there leaves what
        the next spawn redoes."""
        path = log_path(self.home.log_dir(gen.instance), gen.service, gen.id)
        failpoints.hit("spawn.before")
        identity = self.identities.for_spawn(gen, cwd) if tenant else None
        self.trees.create(gen.id, limits)
        failpoints.hit("cgroup.created")
        bounds = (tenant_bounds(limits, self.trees.enforces(), self.identities.in_force)
                  if tenant and limits is not None else process.NO_BOUNDS)
        async with self._forking:
            spawned = await process.spawn(argv, cwd=cwd, env=env, log_path=path, stdio=stdio,
                                          join=self.trees.join_paths(gen.id),
                                          identity=identity, bounds=bounds)
        failpoints.hit("spawn.after")
        running = self.store.record_spawn(gen, spawned.pid, spawned.start_ticks)
        failpoints.hit("spawn.recorded")
        handle = _Handle(gen.id, spawned.pid, spawned.start_ticks, spawned.proc,
                         stopping=expected_exit)
        self._watch(handle)
        return running

    def adopt(self, gen: Generation) -> bool:
        """Watch a generation that survived a control-plane restart; False if it is dead."""
        leader = self.store.local.presence(gen.id).leader
        if leader is None:
            return False
        if gen.id in self._handles:
            return True
        if not process.is_alive(*leader):
            return False
        self._watch(_Handle(gen.id, *leader, None))
        return True

    def is_watched(self, gen_id: int) -> bool:
        handle = self._handles.get(gen_id)
        return handle is not None and not handle.exited.is_set()

    def _watch(self, handle: _Handle) -> None:
        self._handles[handle.gen_id] = handle
        handle.watcher = asyncio.get_running_loop().create_task(
            self._wait_exit(handle), name=f"watch-gen-{handle.gen_id}"
        )

    async def _wait_exit(self, handle: _Handle) -> None:
        if handle.proc is not None:
            code: int | None = await handle.proc.wait()
        else:
            while process.is_alive(handle.pid, handle.start_ticks):
                await self.clock.sleep(0.2)
            code = None  # not our child: its exit status went to someone else
        # The leader is gone; its tree may still have members (the app forked, or
        # daemonized a child): they go now, and only then is the generation gone.
        stopping = handle.stopping_tree
        if stopping is not None:
            await asyncio.wait((stopping,))  # never raises; its outcome is read below
        if stopping is not None and not stopping.cancelled() and not stopping.exception():
            gone = stopping.result()
        else:
            gone = await tree.stop(self.trees, handle.gen_id,
                                   (handle.pid, handle.start_ticks), grace_s=0.0,
                                   clock=self.clock)
        handle.exit_code = code
        if gone:
            gone = await self.bury(handle.gen_id, code)
        if not gone:
            log.warning("generation %s exited but its tree could not be removed",
                        handle.gen_id)
        handle.exited.set()
        self._handles.pop(handle.gen_id, None)
        if not handle.stopping:
            gen = self.store.generations.get_generation(handle.gen_id)
            if gen is not None:
                try:
                    await self.on_exit(gen, code)
                except Exception:
                    # Protects the watcher: a failing restart must not kill supervision.
                    log.exception("on_exit handler failed for generation %s", handle.gen_id)

    # -- readiness -------------------------------------------------------------------

    async def wait_ready(
        self, gen: Generation, health_path: str | None, timeout_s: float,
        notify: asyncio.Event | None = None, host: str | None = None,
    ) -> Readiness:
        """Ready = for a web (`health_path` and a port), `GET health_path` with `Host:
        host` (the instance's, by default) answers non-5xx; for a worker, still running.

        READY=1 on the notify socket does not make a web ready: servers such as gunicorn
        send it once they listen, before their workers have loaded the app. It only
        makes the next probe go out at once. Not ready within `timeout_s`: TIMED_OUT,
        saying what the last probe saw."""
        handle = self._handles.get(gen.id)
        port = self.store.local.presence(gen.id).port
        host = host or gen.instance
        deadline = self.clock.monotonic() + timeout_s
        seen: Probe | None = None
        notified = False
        delay_s = _PROBE_FIRST_S
        while True:
            if handle is None or handle.exited.is_set():
                return Readiness(ReadyOutcome.EXITED, self._exit_said(gen, handle))
            if port is None or health_path is None:
                return Readiness(ReadyOutcome.READY, "running")
            left_s = deadline - self.clock.monotonic()
            seen = await probe_http(port, health_path, host,
                                    timeout_s=min(_PROBE_TIMEOUT_S, max(left_s, 0.05)))
            if isinstance(seen, Answered) and seen.healthy:
                return Readiness(ReadyOutcome.READY,
                                 f"GET {health_path} answered {seen.status}")
            if self.clock.monotonic() >= deadline:
                listening = (listening_on(m.pid for m in self.trees.members(
                    gen.id, (handle.pid, handle.start_ticks)))
                    if isinstance(seen, NotListening) else [])
                return Readiness(ReadyOutcome.TIMED_OUT, describe(
                    seen, port=port, path=health_path, host=host, listening=listening))
            waits = [asyncio.ensure_future(handle.exited.wait())]
            if notify is not None and not notified:
                waits.append(asyncio.ensure_future(notify.wait()))
            _done, pending = await asyncio.wait(waits, timeout=delay_s,
                                                return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            if notify is not None and notify.is_set() and not notified:
                notified, delay_s = True, _PROBE_FIRST_S  # probe at once, and tightly
                continue
            # A refused connect is cheap, and a wake's held requests wait on it (SPEC §7,
            # <= 25 ms), so those are probed tightly; an app that answers but fails is
            # asked less often: each probe is a request it serves and logs.
            delay_s = min(delay_s * 2, _PROBE_REFUSED_EVERY_S if isinstance(seen, NotListening)
                          else _PROBE_FAILING_EVERY_S)

    def _exit_said(self, gen: Generation, handle: _Handle | None) -> str:
        code = handle.exit_code if handle is not None else None
        if code is None and (latest := self.store.generations.get_generation(gen.id)) is not None:
            code = latest.exit_code
        return "exited before it was ready" + (f" (exit code {code})" if code is not None
                                               else "")

    async def _exits_within(self, handle: _Handle, seconds: float | None) -> bool:
        """Whether `handle` exits before `seconds` pass on the supervisor's clock (the
        injected one: a test's settle window or one-shot timeout passes at once); None
        waits for the exit however long it takes."""
        if seconds is None:
            await handle.exited.wait()
            return True
        exited = asyncio.ensure_future(handle.exited.wait())
        window = asyncio.ensure_future(self.clock.sleep(seconds))
        try:
            await asyncio.wait((exited, window), return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
            window.cancel()
        return handle.exited.is_set()

    async def settle(self, gen: Generation, settle_s: float) -> SettleOutcome:
        """Good = still running after the settle window; exit 0 inside it = completed."""
        handle = self._handles.get(gen.id)
        if handle is None:
            # Exited and buried before the window began (a one-shot that is quick to
            # finish): its record says how it ended.
            latest = self.store.generations.get_generation(gen.id)
            done = latest is not None and latest.state is GenState.GONE and (
                latest.exit_code == 0)
            return SettleOutcome.COMPLETED if done else SettleOutcome.CRASHED
        if not await self._exits_within(handle, settle_s):
            return SettleOutcome.GOOD
        return SettleOutcome.COMPLETED if handle.exit_code == 0 else SettleOutcome.CRASHED

    async def wait_exit(self, gen: Generation, timeout_s: float | None,
                        grace_s: float) -> int | None:
        """The exit code of a one-shot, or None if it was still running at the deadline
        (then stopped after `grace_s`; None: no deadline) or is not our child; the
        process is proven gone either way on return. A signal N is the code -N."""
        handle = self._handles.get(gen.id)
        if handle is None:
            # Already buried by its watcher (it exited at once), or never ours.
            latest = self.store.generations.get_generation(gen.id)
            return latest.exit_code if latest is not None else None
        handle.stopping = True  # its exit is the expected end, not a crash to restart
        if not await self._exits_within(handle, timeout_s):
            await self.stop(gen, grace_s)
            return None
        return handle.exit_code

    # -- freeze (keelway/deploy/freezing.py) ---------------------------------------

    async def freeze(self, gen: Generation) -> bool:
        """Stop `gen`'s whole tree in place, memory kept; True once seen frozen."""
        return await self.trees.freeze(gen.id, self.store.local.presence(gen.id).leader)

    def thaw(self, gen: Generation) -> None:
        """Let `gen`'s tree run again (one not frozen is left as it is)."""
        self.trees.thaw(gen.id, self.store.local.presence(gen.id).leader)

    def frozen(self, gen: Generation) -> bool:
        return self.trees.frozen(gen.id, self.store.local.presence(gen.id).leader)

    # -- stop ------------------------------------------------------------------------

    async def stop(self, gen: Generation, grace_s: float) -> bool:
        """Stop a generation's whole tree and record it gone; False if some process of
        it could not be proven gone (the record stays, naming the leftover)."""
        if gen.state is GenState.GONE:
            return True
        leader = self.store.local.presence(gen.id).leader
        if leader is not None and self.refuses_to_die(gen.id) and process.is_alive(*leader):
            return False
        handle = self._handles.get(gen.id)
        if handle is not None:
            handle.stopping = True
        if leader is not None and gen.state is not GenState.STOPPING:
            # The caller's copy may be older than the record (a watcher wrote since).
            self.store.generations.set_generation_state(self.store.generations.get_generation(
                gen.id) or gen,
                                                        GenState.STOPPING)
        # No leader recorded: PLANNED, or spawned with the record lost to a crash; its
        # tree, if any, is found by its cgroup or its environment all the same.
        failpoints.hit("stop.before")
        # A frozen tree (the frozen tier) gets no SIGTERM until it runs: thawed first,
        # whoever stops it (a deploy's retire, a park, a restore, a removal), so it
        # stops with its grace rather than being killed at the end of it.
        self.trees.thaw(gen.id, leader)
        stopping = asyncio.ensure_future(tree.stop(
            self.trees, gen.id, leader, grace_s=grace_s, clock=self.clock,
            proc=handle.proc if handle else None))
        if handle is not None:
            handle.stopping_tree = stopping
        gone = await stopping
        failpoints.hit("stop.after")
        if not gone:
            return False
        if handle is not None:
            await handle.exited.wait()  # its watcher buries it
            latest = self.store.generations.get_generation(gen.id)
            return latest is None or latest.state is GenState.GONE
        return await self.bury(gen.id, None)

    async def bury(self, gen_id: int, exit_code: int | None) -> bool:
        """Record a generation whose tree is proven gone: its cgroup first, then the
        record, with why the kernel ended it if it did (read from the cgroup before it
        goes: an OOM kill, its process limit). Crash between the two: a record naming a
        dead tree with no cgroup, which the reconciler records gone (without a cause).
        False if the cgroup still has a live member."""
        cause = self.trees.exit_cause(gen_id)
        failpoints.hit("cgroup.remove.before")
        removed = await self.trees.remove_reaped(gen_id, self.clock)
        failpoints.hit("cgroup.remove.after")
        if removed:
            self.store.record_gone(gen_id, exit_code, cause)
        return removed

    async def remove_strays(self) -> list[int]:
        """Kill and remove every tree of the home that no live record names (invariant 5):
        left by a crash between a proof and its cgroup's removal, or by a keelway that
        recorded a leader gone while its descendants lived. Returns their generation ids.

        The records are read after the scan: a generation's row is written before its
        cgroup or process exists, so a tree being spawned right now is never a stray.
        """
        # Scanned off the loop: with thousands of processes on the box, reading each
        # one's environment (the proc-scan half) took the loop some 100 ms a pass. A
        # tree proven gone and its record buried while the scan ran is no stray: each
        # one found is looked at again, here, after the records.
        found = await asyncio.to_thread(self.trees.scan)
        strays = [g for g in self._strays(found) if self.trees.still_there(g, found[g])]
        for gen_id in strays:
            if await tree.stop(self.trees, gen_id, None, grace_s=0.0, clock=self.clock):
                failpoints.hit("cgroup.remove.before")
                await self.trees.remove_reaped(gen_id, self.clock)
                failpoints.hit("cgroup.remove.after")
            else:
                log.warning("a stray tree of generation %s could not be removed", gen_id)
        return strays

    def strays(self) -> list[int]:
        """The generations whose tree `remove_strays` removes (`reconcile --dry-run`)."""
        return self._strays(self.trees.scan())

    def _strays(self, found: Mapping[int, object]) -> list[int]:
        live = {g.id for g in self.store.generations.live_generations()}
        return sorted(set(found) - live)

    async def shutdown(self) -> None:
        """Stop watching (the control plane exits); the processes keep running."""
        for handle in list(self._handles.values()):
            handle.stopping = True
            if handle.watcher is not None:
                handle.watcher.cancel()
        self._handles.clear()
