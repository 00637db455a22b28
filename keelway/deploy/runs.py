"""One-off processes (`keelway run APP [--instance H] -- CMD...`), as journaled operations.

A run is a generation of service `run` in the build of the release the instance serves
next (a parked instance's pending release, else ACTIVE's), its working dir and its whole
environment (the app's and the instance's config vars, KEELWAY_DB, the instance key), with
a terminal the CLI lent as its stdio (keelway/run_wire.py; keelway/api/run_server.py serves it).
Rules it keeps:
- Refused, with nothing written, when the instance is failed closed, fenced, down, or
  runs no release: a run never starts what the instance itself may not start.
- Its operation (OpKind.RUN) is never the instance's latest (the store's
  `latest_operation` skips it): convergence of deploys, restarts and crashes reads
  nothing of it. While it runs it is a live operation here, and the reconciler leaves
  its generation to it (`Records.owned`); after a control-plane crash nobody holds its
  terminal any more, so a live run generation is a stray to remove (invariant 5), and
  `finalize_interrupted` fails its operation at boot.
- The instance lock is held while the run is checked and spawned, and lent out while
  it runs (a shell may run for hours; deploys and restarts of the instance go on), then
  taken back to write the outcome.
- The terminal going away (the CLI closed its socket, was killed) is a hangup: SIGHUP,
  as a terminal's hangup sends, then the stop path (SIGTERM, SIGKILL), until proven gone.
- Nothing of the command line is journaled or logged beyond its program name: an
  argument may be a secret (`psql postgres://user:password@...`).

Crash windows (each one in the crash matrix's `run` scenario): after the `run` step is
written, before the spawn: a PLANNED generation, recorded gone at boot. After the spawn,
whether or not its pid was recorded: its tree is found by its cgroup or its marker and
removed at boot as a stray, its CLI having exited 255 when the socket closed. After the
exit, before the outcome is written: the command ran to its end, but the operation says
"interrupted", since its exit code was never journaled. In every case the next boot
leaves no process of the run and its operation failed (`finalize_interrupted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from keelway import failpoints, names
from keelway.builds.manifest import ONE_OFF
from keelway.deploy import targets
from keelway.deploy.errors import OperationError, UserError, checked
from keelway.deploy.generation_start import layered_config
from keelway.deploy.operation import Bound, Plan, PlannedStep, Runner, Spec
from keelway.deploy.steps import Done, Failed
from keelway.deploy.targets import Target
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.plan import Verdict
from keelway.run_wire import Started, exit_code
from keelway.runtime import process
from keelway.runtime.environment import process_env
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState, InstanceState, OpState
from keelway.store.records import Generation, Instance, Operation

failpoints.declare("run.spawn.before", "run.spawn.after", "run.exit.before", "run.exit.after")

RUN_SERVICE = ONE_OFF
# After a hangup's SIGHUP, how long until SIGTERM, then SIGKILL (the stop path's grace).
HANGUP_GRACE_S = 2.0
# The child's status could not be read (its tree outlived the stop): what the CLI exits.
UNKNOWN_EXIT = 255
# Runs the command as given, no shell parsing: `sh` only execs it, so that a missing
# program is the shell's "not found" (127) on the user's terminal, under any mechanism.
_EXEC = ("/bin/sh", "-c", 'exec "$@"', "keelway-run")

# The child's session gets these; None is the hangup (the terminal went away).
Signals = asyncio.Queue[signal.Signals | None]


@dataclass(eq=False)
class Runs:
    store: Store
    home: Home
    supervisor: Supervisor
    runner: Runner

    def resolve(self, app: str, host: str | None) -> Instance:
        """The instance a run goes to; refused (UserError) before anything is written."""
        checked(names.APP, app)
        if host is not None:
            checked(names.HOST, host)
        instances = targets.instances_of(self.store, app, host)
        if host is not None:
            return instances[0]
        if not instances:
            raise UserError(f"{app} has no instance to run in", hint=f"deploy {app} first")
        if len(instances) > 1:
            # Each instance has its own database: guessing one could change the wrong data.
            shown = ", ".join(i.host for i in instances[:3])
            raise UserError(f"{app} has {len(instances)} instances; say which one",
                            hint=f"add --instance HOST (one of {shown}"
                                 f"{', ...' if len(instances) > 3 else ''})")
        return instances[0]

    async def run(self, app: str, host: str | None, argv: Sequence[str], *,
                  stdio: tuple[int, int, int], term: str | None,
                  started: Callable[[Started], Awaitable[None]], signals: Signals) -> int:
        """Run `argv` to its end; returns its exit code (128+N for a signal N).

        Refusals raise `OperationError` (UserError, NotFoundError) with nothing written.
        `started` is awaited once the process runs, with the wire's `Started` message;
        `signals` carries what the user sent the CLI, and None when its terminal went
        away. The caller keeps `stdio`
        and closes it; the child has its own copies.
        """
        inst = self.resolve(app, host)
        one = _OneOff(self, inst.host, tuple(argv), stdio, term, started, signals)
        await self.runner.run(RUN, one, OneOffRequest(inst.host, one.program))
        return one.code

    def dry_run(self, app: str, host: str | None, argv: Sequence[str]) -> Plan:
        """The plan `run` would run now; nothing is written or started."""
        inst = self.resolve(app, host)
        return self.runner.dry_run(RUN, OneOffRequest(inst.host, _program(argv)))

    async def attend(self, gen: Generation, exited: asyncio.Future[int | None],
                     signals: Signals) -> bool:
        """Forward signals to the child's session until it exits; True if its terminal
        went away first, which stops it (proven gone when this returns)."""
        leader = self.store.local.presence(gen.id).leader
        assert leader is not None
        while not exited.done():
            getter = asyncio.ensure_future(signals.get())
            await asyncio.wait((exited, getter), return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
                break
            sig = getter.result()
            if sig is None:
                process.signal_session(*leader, signal.SIGHUP)
                latest = self.store.generations.get_generation(gen.id) or gen
                if not await self.supervisor.stop(latest, HANGUP_GRACE_S):
                    raise OperationError(f"run generation {gen.id} (pid {leader[0]}) did not "
                                         "stop after its terminal went away")
                return True
            process.signal_session(*leader, sig)
        return False


@dataclass
class _OneOff:
    """One run as its operation carries it out: spawned, attended, its exit journaled.
    The parts its two steps share (the run's own, so the spec's effects are bound to it)."""

    runs: Runs
    host: str
    argv: tuple[str, ...]
    stdio: tuple[int, int, int]
    term: str | None
    started: Callable[[Started], Awaitable[None]]
    signals: Signals
    code: int = UNKNOWN_EXIT
    release: int = 0
    gen: Generation | None = None
    exited: asyncio.Future[int | None] | None = None

    @property
    def program(self) -> str:
        return _program(self.argv)

    async def spawn(self, op: Operation) -> Done:
        runs = self.runs
        inst = targets.instance_named(runs.store, self.host)
        target = refusal(runs.store, inst)
        gen = runs.store.plan_generation(
            app=inst.app, instance=inst.host, service=RUN_SERVICE, release=target.release,
            build_digest=target.build_digest, op_id=op.id, port=None)
        env = process_env(
            home=runs.home, app=inst.app, instance=inst.host, service=RUN_SERVICE,
            release=target.release, generation=gen.id, port=None,
            config=layered_config(runs.store, inst.host, target.config),
            build_path=target.build_path)
        if self.term is not None:
            env.setdefault("TERM", self.term)
        runs.home.data_dir(inst.host).mkdir(parents=True, exist_ok=True)
        self.gen = await runs.supervisor.spawn_attached(
            gen, [*_EXEC, *self.argv], target.build_path, env, self.stdio)
        # Taken at once: a command that exits at once is buried by its watcher, and its
        # code is then read from the record.
        self.exited = asyncio.ensure_future(
            runs.supervisor.wait_exit(self.gen, None, HANGUP_GRACE_S))
        self.release = target.release
        return Done(f"generation {self.gen.id} pid {runs.store.local.presence(self.gen.id).pid}")

    async def wait(self) -> Done | Failed:
        """Tell the CLI the command runs, then attend it to its end, the instance lock
        lent out meanwhile."""
        gen, exited, runs = self.gen, self.exited, self.runs
        assert gen is not None and exited is not None
        inst = targets.instance_named(runs.store, self.host)
        pid = runs.store.local.presence(gen.id).pid
        runs.store.ops.add_event("run", f"run of {self.program} started in v{self.release} "
                                 f"(generation {gen.id}, pid {pid})",
                                 app=inst.app, instance=inst.host)
        await self.started(Started(pid or 0, inst.host, self.release))
        # A shell may run for hours: operations on the instance go on meanwhile, and
        # the lock is taken back to write the outcome.
        async with self.runs.runner.lent(self.host):
            hung_up = await self.runs.attend(gen, exited, self.signals)
            returncode = await exited
        self.code = UNKNOWN_EXIT if returncode is None else exit_code(returncode)
        latest = self.runs.store.generations.get_generation(gen.id)
        if latest is None or latest.state is not GenState.GONE:
            return Failed(f"{self.program} (pid {pid}) left processes that could not "
                          "be stopped")
        if hung_up:
            return Failed(f"the terminal went away; {self.program} was stopped "
                          f"(code {self.code})")
        if self.code != 0:
            return Failed(f"{self.program} exited with code {self.code}")
        return Done("exit code 0")


def _program(argv: Sequence[str]) -> str:
    """What of a command line is journaled and logged: its program's name alone."""
    return os.path.basename(argv[0]) if argv else "?"


# -- the run operation ---------------------------------------------------------------


@dataclass(frozen=True)
class OneOffRequest:
    host: str
    program: str


def plan_run(store: Store, request: OneOffRequest) -> Plan:
    """A run's plan: its process spawned in the release the instance serves next, then
    attended until it exits. Refused (UserError), nothing written, when the instance is
    fenced, down, or runs no release."""
    inst = targets.instance_named(store, request.host)
    target = refusal(store, inst)
    return Plan(OpKind.RUN, inst.app, inst.host, (
        PlannedStep(StepKind.RUN, f"spawn {request.program} in v{target.release} "
                    f"({target.build_digest[:12]}) on the lent terminal", "spawn",
                    before=("run.spawn.before",), after=("run.spawn.after",),
                    service=RUN_SERVICE, detail=request.program),
        PlannedStep(StepKind.RUN_EXIT, "attend it until it exits (signals forwarded; "
                    "the terminal going away stops it), the instance lock lent out",
                    "wait", before=("run.exit.before",), after=("run.exit.after",),
                    service=RUN_SERVICE)))


def _spawn(one: _OneOff, _request: OneOffRequest, _step: PlannedStep) -> Bound:
    return one.spawn


def _wait(one: _OneOff, _request: OneOffRequest, _step: PlannedStep) -> Bound:
    async def wait(_op: Operation) -> Done | Failed:
        return await one.wait()

    return wait


INTERRUPTED = "interrupted by a control-plane crash; its process was removed"


def finalize_run(_op: Operation) -> Verdict:
    """A run the control plane that attended it no longer holds: failed, whatever its
    steps say (its exit code, if it exited, was never journaled; its process was a
    stray of the boot pass)."""
    return Verdict(OpState.FAILED, INTERRUPTED)


RUN: Spec[OneOffRequest, _OneOff] = Spec(
    OpKind.RUN, plan_run, {"spawn": _spawn, "wait": _wait}, finalize=finalize_run,
    orphaned=True)


def refusal(store: Store, inst: Instance) -> Target:
    """What a run of `inst` runs in, or UserError: a run never starts what the instance
    itself may not start (fenced, down, no release)."""
    if store.instances.fenced(inst.host):
        raise UserError(f"{inst.host} is fenced: nothing of it may start",
                        hint=f"lift the fence with `keelway unfence {inst.host}`")
    if inst.state is InstanceState.DOWN:
        # ACTIVE still names the build the failed release replaced; its code may not
        # match the data any more (keelway/reconcile/plan.py MARK_DOWN).
        raise UserError(f"{inst.host} is down: {inst.down_reason or 'a release failed'}",
                        hint=f"deploy or roll back {inst.app} first")
    target = next_served(store, inst)
    if target is None:
        raise UserError(f"{inst.app} has no release running on {inst.host}",
                        hint=f"deploy {inst.app} first (`keelway deploy {inst.app} DIR`)")
    return target


def next_served(store: Store, inst: Instance) -> Target | None:
    """The release the instance serves next: a parked one's pending release (a `run --
    manage.py migrate` after a deploy must see the new code and config, not the old
    release it sleeps on), else what runs. A pending release whose build is gone is not
    what the wake serves either (it wakes on ACTIVE's)."""
    if inst.state is InstanceState.PARKED and inst.pending_release is not None:
        pending = targets.release_target(store, inst.app, inst.pending_release)
        if pending is not None:
            return pending
    return targets.running_target(store, inst.host)
