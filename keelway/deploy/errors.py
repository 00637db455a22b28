"""Errors of operations, named for whose fault they are. Each says what to do next."""

from __future__ import annotations

from keelway.names import InvalidName, Rule


class OperationError(Exception):
    """An operation could not do what was asked; the records say where it stopped."""

    code = "operation-failed"

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UserError(OperationError):
    """The request itself is wrong (unknown app, bad host, bad manifest): nothing changed."""

    code = "bad-request"


class NotFoundError(UserError):
    code = "not-found"


class AppFailed(OperationError):
    """The app did not start, get ready or settle: the previous state was kept."""

    code = "app-failed"


class RouterUnavailable(OperationError):
    code = "router-unavailable"


class RouteRefused(OperationError):
    """A route of this instance was refused (left out of the router's table); every
    other route was published."""

    code = "route-refused"


class Fenced(OperationError):
    """The instance is fenced: nothing wakes, starts or restarts it until the holder
    lifts its fence generation. Nothing was changed."""

    code = "fenced"


def refused_name(exc: InvalidName) -> UserError:
    """A name that breaks its rule, as the user hears it (what, and what would do)."""
    return UserError(exc.message, hint=exc.hint)


def checked(rule: Rule, value: str) -> str:
    """`value` if it keeps `rule`; UserError otherwise, nothing changed."""
    try:
        return rule.check(value)
    except InvalidName as exc:
        raise refused_name(exc) from None
