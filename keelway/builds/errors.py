"""The errors of the builds boundary, named for whose fault they are.

    BuildError                  anything staging refused or could not do
      BuildInputError           the user's input is wrong: fix the app or source, retry
        ManifestError           Procfile / keelway.toml
        SourceError             the source path, its kind, a git ref, the app name
        UnsafeArchiveError      a tarball member that could escape or harm the tree
      BuildCommandError         the user's build step (pip install, [build] command) failed
        BuildLimitError         ... because it passed one of its build's limits (time, disk,
                                memory): make the build smaller or ask for more ([build])
      StagingError              this box failed: disk, permissions, a missing `git`

Every message is meant to be shown to a user as-is: it says what failed and, where it
can, what to do next. A BuildError never leaves a named build behind (see stage.py).
"""

from __future__ import annotations


class BuildError(Exception):
    """Base of every error raised by keelway.builds."""


class BuildInputError(BuildError):
    """The user's input cannot be staged; retrying without changing it fails the same way."""


class ManifestError(BuildInputError):
    """The Procfile or keelway.toml is missing or invalid (message names file and line)."""


class SourceError(BuildInputError):
    """The source is not something keelway can stage (missing, wrong kind, unknown ref)."""


class UnsafeArchiveError(BuildInputError):
    """A tar archive is unreadable, or one of its members could escape or harm the tree.

    `member` names the offending member when there is one.
    """

    def __init__(self, message: str, member: str | None = None) -> None:
        super().__init__(message)
        self.member = member


class BuildCommandError(BuildError):
    """A build step exited non-zero or timed out; `tail` holds its last output lines.

    `str()` is the summary and the tail, for a reader who did not see the step's output
    stream by; `summary` alone is for one who did (the CLI shows each line once)."""

    def __init__(self, message: str, tail: list[str]) -> None:
        shown = "\n".join(f"  | {line}" for line in tail)
        super().__init__(f"{message}\n{shown}" if tail else message)
        self.summary = message
        self.tail = tail


class BuildLimitError(BuildCommandError):
    """A build step was killed at one of its build's limits; `limit` names it as its
    `[build]` key: "memory", "timeout" or "disk" (keelway/builds/build_step.py's Limit)."""

    def __init__(self, message: str, tail: list[str], limit: str) -> None:
        super().__init__(message, tail)
        self.limit = limit


class StagingError(BuildError):
    """Staging failed for a reason on this box (disk full, permissions, no git binary)."""
