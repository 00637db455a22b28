"""The records keelway keeps, as immutable msgspec Structs.

Every mutable record carries `version`, bumped on each write; updates compare-and-swap
on it so that two writers can never silently overwrite each other.
"""

from __future__ import annotations

import msgspec

from keelway.journal import Cause, Inhibition, OpKind, StepKind
from keelway.store.lifecycle import (
    GenState,
    InstanceState,
    OpState,
    RequestState,
    RouteState,
    StepState,
)


class App(msgspec.Struct, frozen=True):
    name: str
    config: dict[str, str]
    created_at: float
    version: int
    # Set while `apps destroy` is under way: how it treats data (a `Removal` value).
    destroying: str | None = None


class Instance(msgspec.Struct, frozen=True):
    host: str
    app: str
    state: InstanceState
    fence: int
    schedule_rev: int
    created_at: float
    version: int
    down_reason: str | None = None
    # Layered over the app's config in every process of this instance.
    config: dict[str, str] = {}
    # `instances add` has recorded it and not yet laid it down and started it.
    adding: bool = False
    # Set while `instances remove` (or a destroy) is under way (a `Removal` value).
    removing: str | None = None
    # A release a rollout reached while the instance was parked: its next wake runs it
    # as an attempt (settle, fallback by `pending_cause` and mode) instead of what ran.
    pending_release: int | None = None
    pending_cause: Cause | None = None


class Alias(msgspec.Struct, frozen=True):
    """Another host of one instance: routed to it exactly as its primary host is."""

    host: str
    instance: str
    created_at: float


class Build(msgspec.Struct, frozen=True):
    app: str
    digest: str
    path: str
    good: bool
    created_at: float
    # Where it was staged from (schema migration 9); None if not recorded.
    source: dict[str, str] | None = None


class Release(msgspec.Struct, frozen=True):
    app: str
    number: int
    build_digest: str
    config: dict[str, str]
    description: str
    created_at: float
    # Its build's source when it was written (schema migration 9); None if not recorded.
    source: dict[str, str] | None = None

    @property
    def label(self) -> str:
        return f"v{self.number}"


class ReleaseAttempt(msgspec.Struct, frozen=True):
    """An operation that started processes of release `release` (build `build_digest`)
    on `instance`: the newest such one, and how it ended (running while it runs)."""

    instance: str
    release: int
    build_digest: str
    op_id: int
    state: OpState


class OperationCount(msgspec.Struct, frozen=True):
    """How many operations of `kind` an app has had that are (or ended) in `state`:
    one row of the journal's counts, which /metrics reads (keelway/api/scrape.py)."""

    app: str
    kind: OpKind
    state: OpState
    count: int


class DurationCounts(msgspec.Struct, frozen=True):
    """One app's succeeded operations of a kind by how long each took (its journal's
    created_at to finished_at): `within[i]` took at most the i-th of the bounds asked
    for (cumulative, as a histogram's buckets), `count` in all, `total_s` together."""

    within: tuple[int, ...]
    count: int
    total_s: float


class ReleaseDraft(msgspec.Struct, frozen=True):
    """A release not yet written: the store numbers it when the first instance installs it."""

    app: str
    build_digest: str
    config: dict[str, str]
    description: str


class Step(msgspec.Struct, frozen=True):
    op_id: int
    seq: int
    kind: StepKind
    service: str | None
    before_gen: int | None
    after_gen: int | None
    state: StepState
    error: str | None
    detail: str | None
    started_at: float
    finished_at: float | None
    # Set once the reconciler has dealt with the step's candidate (kept or removed);
    # a step with a candidate and no mark is what convergence still has to look at.
    converged: bool = False

    @property
    def name(self) -> str:
        """The step as `keelway ops` shows it: its kind, said of its service."""
        return self.kind.label(self.service)


class Operation(msgspec.Struct, frozen=True):
    id: int
    app: str
    instance: str
    kind: OpKind
    key: str | None
    request_digest: str | None
    state: OpState
    error: str | None
    warnings: list[str]
    owner: str
    created_at: float
    finished_at: float | None
    version: int
    steps: list[Step] = []
    schedule_rev: int = 0

    @property
    def terminal(self) -> bool:
        return self.state is not OpState.RUNNING


class Request(msgspec.Struct, frozen=True):
    """An idempotency key: the request it named and, once over, its recorded outcome."""

    key: str
    app: str
    kind: str
    digest: str
    state: RequestState
    result: str | None
    owner: str
    created_at: float
    finished_at: float | None


class Generation(msgspec.Struct, frozen=True):
    id: int
    app: str
    instance: str
    service: str
    release: int
    build_digest: str
    op_id: int | None
    state: GenState
    created_at: float
    exited_at: float | None
    exit_code: int | None
    version: int
    # Why the kernel ended its tree, when it did ("killed: out of memory at its 512M
    # limit"); None for an exit of its own or a stop.
    exit_cause: str | None = None


class Presence(msgspec.Struct, frozen=True):
    """What this box alone observes of one generation (`store.local`, keyed by its id):
    the port claimed for it when it was planned and, once spawned, its leader's pid and
    start ticks. None where nothing was observed: not spawned yet, not a web, or a
    generation this box never ran. A fleet shares `Generation`s; never these."""

    generation_id: int
    port: int | None = None
    pid: int | None = None
    start_ticks: int | None = None

    @property
    def leader(self) -> tuple[int, int] | None:
        """(pid, start ticks) of its session leader, if it was spawned: what a liveness
        check or a signal needs, so a reused pid is never taken for it."""
        if self.pid is None or self.start_ticks is None:
            return None
        return self.pid, self.start_ticks


class CrashRetry(msgspec.Struct, frozen=True):
    """The backoff of one service of one instance: `generation_id` crashed (the
    `failures`-th crash in a row) and is restarted at `retry_at` (wall clock)."""

    instance: str
    service: str
    generation_id: int
    failures: int
    crashed_at: float
    retry_at: float


class Active(msgspec.Struct, frozen=True):
    instance: str
    service: str
    generation_id: int
    version: int


class Route(msgspec.Struct, frozen=True):
    host: str
    instance: str
    state: RouteState
    port: int | None
    generation_id: int | None
    version: int


class Event(msgspec.Struct, frozen=True):
    id: int
    at: float
    app: str | None
    instance: str | None
    kind: str
    message: str


class InstanceView(msgspec.Struct, frozen=True):
    """Everything convergence reads of one instance, as one bulk read gives it: the
    instance, its latest operation, ACTIVE, its generations not gone and their
    inhibitions, its own route. The latest operation carries its steps unless it
    succeeded: a succeeded operation leaves nothing to converge, so neither a pass nor
    `status` reads them, and a thousand instances' steps were most of such a read's
    rows (`get_operation` has them)."""

    instance: Instance
    latest: Operation | None
    active: dict[str, int]
    live: list[Generation]
    inhibitions: dict[int, frozenset[Inhibition]]
    route: Route | None
    fenced: bool = False
class Fence(msgspec.Struct, frozen=True):
    """An instance's fence: `generation` only grows; while `held`, nothing wakes, starts
    or restarts the instance. Lifting names the generation it lifts."""

    instance: str
    generation: int
    held: bool
    reason: str | None
    updated_at: float
