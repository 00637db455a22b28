"""A planned step: what an operation will journal and run, read from the records before
anything changes, so that `--dry-run` prints exactly the list the operation runs.

A plan is computed under the instance lock, after convergence, by a pure function of
the records (`plan(store, request) -> Plan`: reads only); the operation then runs its
steps in order, each through `Steps.run` between its failpoints. A step whose effect
finds, when it runs, that the records moved under it (a route taken over under a fence,
say) stops the operation there, as a value: the plan says what is done when nothing
moves, never more than that.

A `delegated` step is journaled by the path it names (the verified start path journals
its own spawn and ready steps; an attempt is an operation of its own): listed so the
dry run shows it, not journaled again by the operation that reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keelway.deploy.steps import Effect, Failed, Steps
from keelway.journal import StepKind


@dataclass(frozen=True)
class PlannedStep:
    kind: StepKind
    # One line for `--dry-run`: what this step does, to what.
    says: str
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    service: str | None = None
    before_gen: int | None = None
    detail: str | None = None
    delegated: bool = False
    # Steps of one phase (the numbered steps of an operation's header: "fence and stop
    # the instance") print as one line of the dry run; 0: a line of its own.
    phase: int = 0

    def view(self) -> dict[str, object]:
        return {"kind": self.kind.value, "says": self.says, "service": self.service,
                "generation": self.before_gen, "delegated": self.delegated,
                "failpoints": [*self.before, *self.after]}


@dataclass(frozen=True)
class Plan:
    steps: tuple[PlannedStep, ...] = field(default=())
    # Why the operation does nothing (or stops before its first step), when it does.
    refused: str | None = None

    def lines(self) -> tuple[str, ...]:
        """The dry run: one line per step, or per phase for steps that name one."""
        lines: list[str] = []
        last = 0
        for step in self.steps:
            if step.phase and step.phase == last:
                lines[-1] += f"; {step.says}"
            else:
                lines.append(step.says)
            last = step.phase
        return tuple(lines)

    def kinds(self) -> tuple[StepKind, ...]:
        return tuple(step.kind for step in self.steps)

    def view(self) -> list[dict[str, object]]:
        return [step.view() for step in self.steps]

    def dry_run(self) -> dict[str, object]:
        """What every `--dry-run` answers (the API's JSON): the lines and the steps."""
        return {"dry_run": True, "refused": self.refused, "plan": list(self.lines()),
                "steps": self.view()}


async def run(steps: Steps, step: PlannedStep, effect: Effect) -> Failed | None:
    """Journal and run one planned step (keelway/deploy/steps.py)."""
    return await steps.run(step.kind, effect, before=step.before, after=step.after,
                           service=step.service, before_gen=step.before_gen,
                           detail=step.detail)
