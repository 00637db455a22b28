"""What an operation ends as, as a value: the one vocabulary of outcomes that attempts,
the runner (operation.py), the crash restarts and the deployer return to each other.

A leaf of keelway/deploy, so the lower parts read outcomes without importing the attempt
that produces most of them: the deploy path runs one way, never back up.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Progress: a line of progress for whoever asked (the CLI shows it; the reconciler drops
# it), the build's own type, so a build's lines and an operation's reach one callback.
from keelway.builds.build_step import Progress as Progress


class Outcome(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    DOWN = "down"
    SUPERSEDED = "superseded"


@dataclass
class Result:
    outcome: Outcome
    reason: str | None = None
    generations: dict[str, int] = field(default_factory=dict)
    released: bool = False
    # Done by deferring: the instance is parked, and its next wake runs the release.
    deferred: bool = False
