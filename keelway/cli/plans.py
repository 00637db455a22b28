"""`--dry-run` of an operation: the one flag and the one way its plan is shown (the
lines the API sends, which are the runner's own descriptions of its steps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from keelway.cli.base import client
from keelway.cli.output import emit_json

F = TypeVar("F", bound=Callable[..., Any])


def dry_run_option(func: F) -> F:
    return click.option("--dry-run", is_flag=True,
                        help="Print the plan it would run; change nothing.")(func)


def echo_plan(data: dict[str, Any], as_json: bool) -> None:
    """Show a dry run's answer: its JSON, or the plan's lines."""
    if as_json:
        emit_json(data)
        return
    for line in data["lines"]:
        click.echo(line)


def dry_run_operation(path: str, body: dict[str, Any], as_json: bool) -> None:
    """POST `body` as a dry run to `path` and show the plan it answers."""
    echo_plan(client(None).request("POST", path, body | {"dry_run": True}), as_json)
