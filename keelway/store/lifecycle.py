"""The lifecycles of journaled things: each an Enum plus one transition table.

Everything that decides whether a state may follow another lives in this file, and the
store applies `check` on every write of a state, so an illegal move is refused at the
single place where it would become durable.
"""

from __future__ import annotations

import enum

from keelway.store.errors import IllegalTransition

__all__ = ["GenState", "IllegalTransition", "InstanceState", "OpState", "Removal",
           "RequestState", "RolloutState", "RouteState", "StepState", "check"]


class OpState(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class StepState(enum.StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class GenState(enum.StrEnum):
    # Row written, port claimed, no process yet: the journal entry that precedes a spawn.
    PLANNED = "planned"
    RUNNING = "running"
    READY = "ready"
    STOPPING = "stopping"
    # Proven dead (reaped, or pid + start time no longer alive). Terminal.
    GONE = "gone"


class RouteState(enum.StrEnum):
    SERVING = "serving"
    HOLDING = "holding"
    GATED = "gated"
    DRAINING = "draining"
    # Its instance is parked: the router holds a request and asks the control plane to
    # wake the instance. No upstream: nothing of the instance runs.
    PARKED = "parked"
    # Its instance is frozen (keelway/deploy/freezing.py): its processes stopped in
    # place, memory kept. The router treats it as parked (holds the request, asks for a
    # wake, which thaws); the port stays, for the thaw to serve on again.
    FROZEN = "frozen"


class InstanceState(enum.StrEnum):
    # The user wants it running; the supervisor restarts crashed published generations.
    RUNNING = "running"
    # Stopped by the user: nothing is restarted, the route answers 503.
    STOPPED = "stopped"
    # Down on purpose after a hold-mode release failed once it had executed: it may have
    # migrated data, so nothing falls back and nothing restarts it until the next
    # deploy, rollback or start. `down_reason` says why.
    DOWN = "down"
    # Scaled to zero (keelway/deploy/parking.py): nothing of it runs, ACTIVE still names
    # what ran, so a wake respawns exactly that; the route is `parked`.
    PARKED = "parked"


class Removal(enum.StrEnum):
    """What removing an instance (alone, or in an app's destroy) does with its data:
    the durable intent of a removal, which boot carries on after a crash."""

    KEEP_DATA = "keep-data"
    PURGE_DATA = "purge-data"


class RequestState(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


_OP: dict[OpState, frozenset[OpState]] = {
    OpState.RUNNING: frozenset({OpState.SUCCEEDED, OpState.FAILED}),
    OpState.SUCCEEDED: frozenset(),
    OpState.FAILED: frozenset(),
}

_STEP: dict[StepState, frozenset[StepState]] = {
    StepState.PENDING: frozenset({StepState.SUCCEEDED, StepState.FAILED}),
    # A reconciler may mark a step failed that was written succeeded but whose effect it
    # had to undo; nothing ever moves a failed step back.
    StepState.SUCCEEDED: frozenset({StepState.FAILED}),
    StepState.FAILED: frozenset(),
}

_GEN: dict[GenState, frozenset[GenState]] = {
    GenState.PLANNED: frozenset({GenState.RUNNING, GenState.GONE}),
    GenState.RUNNING: frozenset({GenState.READY, GenState.STOPPING, GenState.GONE}),
    GenState.READY: frozenset({GenState.STOPPING, GenState.GONE}),
    GenState.STOPPING: frozenset({GenState.GONE}),
    GenState.GONE: frozenset(),
}

# Only a running instance parks (a stopped or down one has nothing to scale to zero, and
# parking it would make a request wake what its user stopped); a parked one wakes
# (RUNNING), is stopped, or is marked down by an interrupted hold release.
_INSTANCE: dict[InstanceState, frozenset[InstanceState]] = {
    InstanceState.RUNNING: frozenset({InstanceState.STOPPED, InstanceState.DOWN,
                                      InstanceState.PARKED}),
    InstanceState.STOPPED: frozenset({InstanceState.RUNNING, InstanceState.DOWN}),
    InstanceState.DOWN: frozenset({InstanceState.RUNNING, InstanceState.STOPPED}),
    InstanceState.PARKED: frozenset({InstanceState.RUNNING, InstanceState.STOPPED,
                                     InstanceState.DOWN}),
}

# A parked route has no upstream, so it never drains: it is served again (a wake),
# gated (stopped, down) or held; any other state may move to any other.
_ROUTE: dict[RouteState, frozenset[RouteState]] = {
    **{state: frozenset(RouteState) - {state} for state in RouteState},
    RouteState.PARKED: frozenset({RouteState.SERVING, RouteState.GATED, RouteState.HOLDING}),
}

class RolloutState(enum.StrEnum):
    """Where a release's rollout across an app's instances stands (issue #19). It is
    never silently a mixed fleet: `running`; `paused` by a person before its next
    cohort, or `halted` by a cohort that failed (an instance, its 5xx budget, or no
    traffic under `halt`), the instances on the release serving it meanwhile, both
    waiting for `resume` or `abort`; `done`; `aborted` (every rolled instance back on
    the release before); `superseded` by a newer release's rollout."""

    RUNNING = "running"
    PAUSED = "paused"
    HALTED = "halted"
    DONE = "done"
    ABORTED = "aborted"
    SUPERSEDED = "superseded"


# A rollout that has not ended may be aborted or superseded; a running one also pauses,
# halts or ends done, and a paused or halted one runs again. Ended ones are final.
_ENDINGS = frozenset({RolloutState.ABORTED, RolloutState.SUPERSEDED})
_ROLLOUT: dict[RolloutState, frozenset[RolloutState]] = {
    RolloutState.RUNNING: _ENDINGS | {RolloutState.PAUSED, RolloutState.HALTED,
                                      RolloutState.DONE},
    RolloutState.PAUSED: _ENDINGS | {RolloutState.RUNNING},
    RolloutState.HALTED: _ENDINGS | {RolloutState.RUNNING},
    **{ended: frozenset() for ended in (RolloutState.DONE, *_ENDINGS)},
}

_TABLES: dict[type[enum.Enum], dict[object, frozenset[object]]] = {
    OpState: dict(_OP),  # type: ignore[arg-type]
    StepState: dict(_STEP),  # type: ignore[arg-type]
    GenState: dict(_GEN),  # type: ignore[arg-type]
    InstanceState: dict(_INSTANCE),  # type: ignore[arg-type]
    RouteState: dict(_ROUTE),  # type: ignore[arg-type]
    RolloutState: dict(_ROLLOUT),  # type: ignore[arg-type]
}


def check(old: enum.Enum, new: enum.Enum) -> None:
    """Refuse a move that the lifecycle of `old`'s type does not allow (staying is allowed)."""
    if old == new:
        return
    table = _TABLES[type(old)]
    if new not in table[old]:
        raise IllegalTransition(f"{type(old).__name__}: {old.value} -> {new.value}")
